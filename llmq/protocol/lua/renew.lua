-- Extend the leases a worker holds, and tell it what changed: per (id, attempt)
-- pair, 'ok', 'lost' (the lease is gone or another attempt's: the worker is fenced
-- for it and must stop without writing) or 'cancelled' (the cancel flag is set:
-- the worker cancels it, even if it missed the message). See llmq.protocol.codec.RenewReply.
-- The renewal is also the worker's beat in the model's slot (enqueue.lua hands a
-- request only to a parked worker that beats); beats older than `forget_ms` go.
local running_key = KEYS[1]
local leases_key = KEYS[2]
local clock_key = KEYS[3]
local beats_key = KEYS[4]

local lease_ms = tonumber(ARGV[1])
local cancel_prefix = ARGV[2]
local worker_id = ARGV[3]
local forget_ms = tonumber(ARGV[4])
local pairs_from = 5

local now = lease_now(clock_key)
local expiry = ms(now + lease_ms)
if worker_id ~= '' then
  redis.call('ZADD', beats_key, ms(now), worker_id)
  redis.call('ZREMRANGEBYSCORE', beats_key, '-inf', ms(now - forget_ms))
end
local out = {}
for i = pairs_from, #ARGV, 2 do
  local id, attempt = ARGV[i], tonumber(ARGV[i + 1])
  local _, _, held = parse_lease(redis.call('HGET', leases_key, id))
  if held ~= attempt or not redis.call('ZSCORE', running_key, id) then
    table.insert(out, 'lost')
  else
    redis.call('ZADD', running_key, 'XX', expiry, id)
    if redis.call('EXISTS', cancel_prefix .. id) == 1 then
      table.insert(out, 'cancelled')
    else
      table.insert(out, 'ok')
    end
  end
end
return out
