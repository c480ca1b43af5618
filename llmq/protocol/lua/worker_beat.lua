-- A worker's registry heartbeat, in lease time: its entry in the workers set is
-- scored by the lease clock, so a stall or restart of Redis does not make live
-- workers look dead (llmq.registry.live_workers judges by the same clock). Entries
-- older than `ttl_ms` of lease time are dropped with their info keys; the info key's
-- own expiry (four TTLs of real time) only collects what nobody drops.
local workers_key = KEYS[1]
local info_key = KEYS[2]
local clock_key = KEYS[3]

local worker_id = ARGV[1]
local info = ARGV[2]
local ttl_ms = tonumber(ARGV[3])
local info_prefix = ARGV[4]

local now = lease_now(clock_key)
redis.call('SET', info_key, info, 'PX', ms(4 * ttl_ms))
redis.call('ZADD', workers_key, ms(now), worker_id)
for _, dead in ipairs(redis.call('ZRANGEBYSCORE', workers_key, '-inf', ms(now - ttl_ms))) do
  redis.call('DEL', info_prefix .. dead)
end
redis.call('ZREMRANGEBYSCORE', workers_key, '-inf', ms(now - ttl_ms))
return 1
