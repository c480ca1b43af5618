-- The batch feeder's lease (one API process feeds at a time): with ms > 0, take it
-- if free or keep it if this process holds it (its TTL set to ms); with ms = 0, give
-- it up if this process holds it, so that another takes over at once (a process
-- that stops hands its feeding over). Returns 1 if this process holds the lease
-- after the call (ms > 0) or gave it up (ms = 0), 0 otherwise.
local lease_key = KEYS[1]

local holder = ARGV[1]
local ms = tonumber(ARGV[2])

local current = redis.call('GET', lease_key)
if ms == 0 then
  if current == holder then
    redis.call('DEL', lease_key)
    return 1
  end
  return 0
end
if current and current ~= holder then
  return 0
end
redis.call('SET', lease_key, holder, 'PX', ms)
return 1
