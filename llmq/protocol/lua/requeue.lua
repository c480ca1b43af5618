-- Hand a claimed request back to the queue at its original place (its worker is
-- stopping, or has no slot for a hand-off, or the run gives way to fair share), and
-- into its tenant's fair-share set (lua/fair.lua fair_requeue). Only the attempt that holds the lease
-- may: 1 when requeued, 0 when the lease is not (or no longer) this attempt's.
-- The caller then raises the request's fence past the attempt (fence.lua, in the
-- request's slot), so nothing the attempt still writes lands.
local queue_key = KEYS[1]
local running_key = KEYS[2]
local leases_key = KEYS[3]
local costs_key = KEYS[4]
local fair_key = KEYS[5]
local tenants_key = KEYS[6]

local id = ARGV[1]
local attempt = tonumber(ARGV[2])
local wake_channel = ARGV[3]
local in_progress_marker = ARGV[4]
local fairq_prefix = ARGV[5]

local score, cost, held = parse_lease(redis.call('HGET', leases_key, id))
if held ~= attempt then
  return 0
end
redis.call('HDEL', leases_key, id)
redis.call('ZREM', running_key, id)
redis.call('DEL', in_progress_marker)
redis.call('ZADD', queue_key, score, id)
redis.call('HSET', costs_key, id, cost)
fair_requeue(fair_key, tenants_key, fairq_prefix, id, score)
redis.call('PUBLISH', wake_channel, id)
return 1
