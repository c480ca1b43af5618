-- Takes (SPOP) up to `limit` attached requests of API processes whose lease ran out
-- in lease time, and forgets a dead process once it has none left; returns the
-- members (llmq.protocol.codec deadline members "<id>:<model>") for the caller to cancel.
local apis_key = KEYS[1]
local clock_key = KEYS[2]

local attached_prefix = ARGV[1]
local limit = tonumber(ARGV[2])

local dead = redis.call('ZRANGEBYSCORE', apis_key, '-inf', ms(lease_now(clock_key)),
  'LIMIT', 0, 10)
local out = {}
local left = limit
for _, pid in ipairs(dead) do
  local key = attached_prefix .. pid
  if left > 0 then
    for _, m in ipairs(redis.call('SPOP', key, left)) do
      table.insert(out, m)
      left = left - 1
    end
  end
  if redis.call('SCARD', key) == 0 then
    redis.call('ZREM', apis_key, pid)
  end
end
return out
