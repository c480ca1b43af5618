-- A request's run ended: drop its lease, if this attempt still holds it, settle
-- its tenant's fair-share charge to the tokens it used (lua/fair.lua) and delete
-- KEYS[5..] (a finish's: the job record, its try counter, its in-progress marker).
-- 1 when released, 0 when the lease belongs to another attempt (or none): then
-- nothing changes, and the attempt that holds the lease ends the request.
local running_key = KEYS[1]
local leases_key = KEYS[2]
local fair_key = KEYS[3]
local vtc_key = KEYS[4]

local id = ARGV[1]
local attempt = tonumber(ARGV[2])
local used = tonumber(ARGV[3])

local _, _, held = parse_lease(redis.call('HGET', leases_key, id))
if held ~= attempt then
  return 0
end
redis.call('HDEL', leases_key, id)
fair_settle(fair_key, vtc_key, id, used)
redis.call('ZREM', running_key, id)
for i = 5, #KEYS do
  redis.call('DEL', KEYS[i])
end
return 1
