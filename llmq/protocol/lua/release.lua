-- A request's run ended: drop its lease, if this attempt still holds it.
-- 1 when released, 0 when the lease belongs to another attempt (or none).
local running_key = KEYS[1]
local leases_key = KEYS[2]
local fair_key = KEYS[3]

local id = ARGV[1]
local attempt = tonumber(ARGV[2])

local _, _, held = parse_lease(redis.call('HGET', leases_key, id))
if held ~= attempt then
  return 0
end
redis.call('HDEL', leases_key, id)
redis.call('HDEL', fair_key, id)
redis.call('ZREM', running_key, id)
return 1
