-- Renew an API process's liveness lease: it counts as dead `grace_ms` of lease time
-- from now (so a stall of Redis does not make live API processes look dead).
local apis_key = KEYS[1]
local clock_key = KEYS[2]

local process_id = ARGV[1]
local grace_ms = tonumber(ARGV[2])

redis.call('ZADD', apis_key, ms(lease_now(clock_key) + grace_ms), process_id)
return 1
