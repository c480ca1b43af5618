-- The lease clock, prepended to every script that sets or judges a lease.
--
-- Leases are judged by time kept in Redis (one clock per slot, llmq.protocol.keys.clock of a
-- model and llmq.protocol.keys.CLOCK: hash real -> Redis's own TIME in ms when last seen,
-- lease -> the lease clock in ms). Each call advances the
-- lease clock by the real time since the previous call, but by at most CLOCK_CAP_MS:
-- in a live system some process calls every sweep interval (0.25 s), so lease time
-- follows real time; a stall of Redis, a restart (AOF keeps the key) or an outage
-- advances it by CLOCK_CAP_MS at most, so nobody's lease runs out for Redis's sake.
-- A worker that is stopped or cut off still loses its lease: the others' calls keep
-- the clock moving. 300 ms: above the sweep interval, so a live system's clock
-- never falls behind, and well below a lease (1 s) minus a heartbeat (0.25 s).
local CLOCK_CAP_MS = 300

-- Where the batch band starts (llmq.protocol.queue.BATCH_BAND_MS): the batch lines
-- waiting above it, which the batch feeder bounds itself, do not count toward a
-- model's queue bound, so live admission is the same with a batch running.
local BATCH_BAND_MS = '10000000000000'

local function live_depth(queue_key)
  return redis.call('ZCOUNT', queue_key, '-inf', '(' .. BATCH_BAND_MS)
end

local function ms(n)
  return string.format('%d', n)
end

local function lease_now(clock_key)
  local t = redis.call('TIME')
  local real = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local saved = redis.call('HMGET', clock_key, 'real', 'lease')
  local last, lease = tonumber(saved[1]), tonumber(saved[2])
  if last == nil or lease == nil then
    lease = real
  else
    lease = lease + math.min(math.max(real - last, 0), CLOCK_CAP_MS)
  end
  redis.call('HSET', clock_key, 'real', ms(real), 'lease', ms(lease))
  return lease
end

-- A lease value "score:cost:attempt" (see llmq.protocol.codec.Lease).
local function parse_lease(value)
  if not value then
    return nil
  end
  local score, cost, attempt = string.match(value, '^(-?%d+):(%d+):(%d+)$')
  if not score then
    return nil
  end
  return tonumber(score), tonumber(cost), tonumber(attempt)
end

-- Raise a request's fence to at least `lowest` (never lower it).
local function raise_fence(fence_key, lowest, ttl)
  local current = tonumber(redis.call('HGET', fence_key, 'attempt') or '0')
  if lowest > current then
    redis.call('HSET', fence_key, 'attempt', lowest)
  end
  redis.call('EXPIRE', fence_key, ttl)
end
