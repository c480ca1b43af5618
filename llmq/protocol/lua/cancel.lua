-- Cancel a request. 1: it was queued and is gone. 0: not queued (running or
-- finished): the flag is set, which the running worker finds at its next lease
-- renewal (renew.lua) even if it missed the message published here.
local queue_key = KEYS[1]
local costs_key = KEYS[2]
local deadlines_key = KEYS[3]
local job_key = KEYS[4]
local flag_key = KEYS[5]
local routes_key = KEYS[6]
local overtaken_key = KEYS[7]
local held_key = KEYS[8]
local fair_key = KEYS[9]

local id = ARGV[1]
local flag_ttl_ms = ARGV[2]
local cancel_channel = ARGV[3]

if redis.call('ZREM', queue_key, id) == 1 then
  redis.call('HDEL', costs_key, id)
  redis.call('ZREM', deadlines_key, id)
  redis.call('DEL', job_key)
  redis.call('HDEL', fair_key, id, CHARGED .. id)
  if routes_key then
    redis.call('HDEL', routes_key, id)
    redis.call('HDEL', overtaken_key, id)
    redis.call('HDEL', held_key, id)
  end
  return 1
end
redis.call('SET', flag_key, '1', 'PX', flag_ttl_ms)
redis.call('PUBLISH', cancel_channel, id)
return 0
