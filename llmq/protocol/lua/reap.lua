-- Requests whose lease ran out in lease time (their worker died, stopped, or is cut
-- off) go back to the queue at their original score (and into their tenant's fair-share
-- set: lua/fair.lua fair_requeue), in two calls with the fence
-- raised between them (llmq.protocol.queue.Queue.reap). Called with no pairs, it changes
-- nothing and returns the due requests as llmq.protocol.codec.Reaped pairs (id, attempt);
-- the caller raises their fences (fence.lua, in each request's slot), then calls
-- again with those pairs, and each request whose lease is still that attempt's
-- and still due is requeued. Returns the pairs requeued.
local running_key = KEYS[1]
local queue_key = KEYS[2]
local leases_key = KEYS[3]
local costs_key = KEYS[4]
local clock_key = KEYS[5]
local fair_key = KEYS[6]
local tenants_key = KEYS[7]

local limit = ARGV[1]
local wake_channel = ARGV[2]
local in_progress_prefix = ARGV[3]
local fairq_prefix = ARGV[4]
local pairs_from = 5

local now = lease_now(clock_key)
local out = {}
if #ARGV < pairs_from then
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', running_key, '-inf', ms(now), 'LIMIT', 0, limit)) do
    local _, _, attempt = parse_lease(redis.call('HGET', leases_key, id))
    table.insert(out, id)
    table.insert(out, attempt or 0)
  end
  return out
end
for i = pairs_from, #ARGV, 2 do
  local id, fenced = ARGV[i], tonumber(ARGV[i + 1])
  local expiry = tonumber(redis.call('ZSCORE', running_key, id) or 'nil')
  local score, cost, attempt = parse_lease(redis.call('HGET', leases_key, id))
  if expiry and expiry <= now and attempt == fenced then
    redis.call('ZREM', running_key, id)
    redis.call('DEL', in_progress_prefix .. id)
    redis.call('HDEL', leases_key, id)
    redis.call('ZADD', queue_key, score, id)
    redis.call('HSET', costs_key, id, cost)
    fair_requeue(fair_key, tenants_key, fairq_prefix, id, score)
    table.insert(out, id)
    table.insert(out, attempt)
  elseif expiry and expiry <= now and not attempt then
    -- a lease without a valid value: drop it (nothing says where to requeue it)
    redis.call('ZREM', running_key, id)
    redis.call('HDEL', leases_key, id)
  end
end
if #out > 0 then
  redis.call('PUBLISH', wake_channel, 'reaped')
end
return out
