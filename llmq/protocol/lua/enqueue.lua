-- Add a request unless the queue is full; hand it to a parked worker if one waits.
-- Returns 0 when the queue is full, 1 when queued, 2 when handed to a parked worker.
-- Every key is in the model's slot; the request's record and lifecycle note are
-- written before this by record.lua (see llmq.protocol.queue.Queue.enqueue for the order).
--
-- The hand-off: when the queue is empty and a worker is parked (see claim.lua), the
-- request is claimed for that worker here (attempt 1) and published on its own
-- channel with everything a claim would have returned (llmq.protocol.codec.Handoff), so it
-- starts without a claim round trip. PUBLISH counts the receivers: a worker that is
-- not listening (dead, reconnecting) is unparked and the next one tried; with none,
-- the request is queued as usual. PUBLISH also counts a half-open connection of a
-- worker cut off from Redis, so a parked worker whose heartbeat (in lease
-- time: the model's beats, bumped by renew.lua) is older than its lease is skipped
-- and unparked too: it could not renew the lease it would be handed.
local queue_key = KEYS[1]
local job_key = KEYS[2]
local costs_key = KEYS[3]
local deadlines_key = KEYS[4]
local parked_key = KEYS[5]
local terms_key = KEYS[6]
local running_key = KEYS[7]
local leases_key = KEYS[8]
local clock_key = KEYS[9]
local beats_key = KEYS[10]

local id = ARGV[1]
local score = ARGV[2]
local job = ARGV[3]
local ttl_ms = ARGV[4]
local max_depth = tonumber(ARGV[5])
local wake_channel = ARGV[6]
local cost = ARGV[7]
local deadline_ms = ARGV[8]
local handoff_prefix = ARGV[9]
local in_progress_prefix = ARGV[10]
local retry_prefix = ARGV[11]
local retry_ttl = ARGV[12]

if redis.call('ZCARD', queue_key) >= max_depth then
  return 0
end
redis.call('SET', job_key, job, 'PX', ttl_ms)

local function unpark(w)
  redis.call('ZREM', parked_key, w)
  redis.call('HDEL', terms_key, w)
end

if redis.call('ZCARD', queue_key) == 0 and redis.call('ZCARD', parked_key) > 0 then
  local now = lease_now(clock_key)
  local n_cost = tonumber(cost)
  for _, w in ipairs(redis.call('ZRANGE', parked_key, 0, 15)) do
    local terms = redis.call('HGET', terms_key, w)
    local free, budget, idle, lease, held
    if terms then
      free, budget, idle, lease, held = string.match(terms, '^(%d+)|(-?%d+)|(%d)|(%d+)|(%d+)$')
    end
    local beat = tonumber(redis.call('ZSCORE', beats_key, w) or '0')
    if not free or now - beat > tonumber(lease) then
      unpark(w)
    elseif idle == '1' or tonumber(budget) < 0 or n_cost <= tonumber(budget) then
      local message = id .. '|' .. score .. '|' .. cost .. '|1|' .. job
      if redis.call('PUBLISH', handoff_prefix .. w, message) > 0 then
        redis.call('ZADD', running_key, ms(now + tonumber(lease)), id)
        redis.call('HSET', leases_key, id, score .. ':' .. cost .. ':1')
        redis.call('SET', in_progress_prefix .. id, '1', 'PX', held)
        redis.call('SET', retry_prefix .. id, '1', 'EX', retry_ttl)
        if tonumber(free) > 1 then
          local left = tonumber(budget) < 0 and -1 or math.max(tonumber(budget) - n_cost, 0)
          redis.call('HSET', terms_key, w,
            (free - 1) .. '|' .. left .. '|0|' .. lease .. '|' .. held)
          local last = redis.call('ZRANGE', parked_key, -1, -1, 'WITHSCORES')
          redis.call('ZADD', parked_key, ms(math.max(now, tonumber(last[2]) + 1)), w)
        else
          unpark(w)
        end
        return 2
      end
      unpark(w)
    end
  end
end
redis.call('ZADD', queue_key, score, id)
redis.call('HSET', costs_key, id, cost)
redis.call('ZADD', deadlines_key, deadline_ms, id)
redis.call('PUBLISH', wake_channel, id)
return 1
