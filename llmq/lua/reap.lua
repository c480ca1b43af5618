-- Requests whose lease ran out in lease time (their worker died, stopped, or is cut
-- off) go back to the queue at their original score. Returns llmq.codec.Reaped
-- pairs (id, attempt), whose fences the caller then raises past the attempt
-- (fence.lua, in each request's slot), so that worker's later writes are refused
-- (publish.lua).
local running_key = KEYS[1]
local queue_key = KEYS[2]
local leases_key = KEYS[3]
local costs_key = KEYS[4]
local clock_key = KEYS[5]

local limit = ARGV[1]
local wake_channel = ARGV[2]
local in_progress_prefix = ARGV[3]

local now = lease_now(clock_key)
local due = redis.call('ZRANGEBYSCORE', running_key, '-inf', ms(now), 'LIMIT', 0, limit)
local out = {}
for _, id in ipairs(due) do
  redis.call('ZREM', running_key, id)
  redis.call('DEL', in_progress_prefix .. id)
  local score, cost, attempt = parse_lease(redis.call('HGET', leases_key, id))
  redis.call('HDEL', leases_key, id)
  if score then
    redis.call('ZADD', queue_key, score, id)
    redis.call('HSET', costs_key, id, cost)
    table.insert(out, id)
    table.insert(out, attempt)
  end
end
if #out > 0 then
  redis.call('PUBLISH', wake_channel, 'reaped')
end
return out
