-- Remove the model's queued requests whose deadline passed (deadlines are the
-- clients' real time, not lease time); returns their ids. One call per model: each
-- model's keys share its slot (llmq.protocol.keys). Their route hints go with them.
local deadlines_key = KEYS[1]
local queue_key = KEYS[2]
local costs_key = KEYS[3]
local routes_key = KEYS[4]
local overtaken_key = KEYS[5]
local held_key = KEYS[6]
local fair_key = KEYS[7]

local now_ms = ARGV[1]
local limit = ARGV[2]
local job_prefix = ARGV[3]

local due = redis.call('ZRANGEBYSCORE', deadlines_key, '-inf', now_ms, 'LIMIT', 0, limit)
local out = {}
for _, id in ipairs(due) do
  redis.call('ZREM', deadlines_key, id)
  if redis.call('ZREM', queue_key, id) == 1 then
    redis.call('HDEL', costs_key, id)
    redis.call('HDEL', fair_key, id, CHARGED .. id)
    if routes_key then
      redis.call('HDEL', routes_key, id)
      redis.call('HDEL', overtaken_key, id)
      redis.call('HDEL', held_key, id)
    end
    redis.call('DEL', job_prefix .. id)
    table.insert(out, id)
  end
end
return out
