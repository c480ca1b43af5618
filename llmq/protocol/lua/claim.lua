-- Claim the lowest-scored request for a worker. Requests past their deadline or
-- cancelled are removed on the way and reported. The claimed request's job record
-- is read and its try counter bumped here, as arq's run_job would do in a round trip
-- of its own; the try number is the attempt, the fencing token of this run.
-- A worker that leaves the queue empty with a slot still free is *parked*: enqueue.lua
-- then hands it the next request directly. Parked terms: "free|budget|idle|lease
-- ms|in-progress ms"; the parked set is ordered by when the worker parked (each
-- newcomer, or a worker handed a request, goes to the back: workers take turns).
-- Reply: llmq.protocol.codec.ClaimReply.
local queue_key = KEYS[1]
local running_key = KEYS[2]
local costs_key = KEYS[3]
local deadlines_key = KEYS[4]
local leases_key = KEYS[5]
local parked_key = KEYS[6]
local terms_key = KEYS[7]
local clock_key = KEYS[8]

local deadline_now = tonumber(ARGV[1])
local lease_ms = tonumber(ARGV[2])
local in_progress_prefix = ARGV[3]
local in_progress_ms = ARGV[4]
local budget = tonumber(ARGV[5])
local idle = ARGV[6]
local job_prefix = ARGV[7]
local cancel_prefix = ARGV[8]
local retry_prefix = ARGV[9]
local retry_ttl = ARGV[10]
local worker_id = ARGV[11]
local free_slots = tonumber(ARGV[12])
local park_ttl_ms = ARGV[13]

local now = lease_now(clock_key)
local expired, cancelled = {}, {}

local function drop(id)
  redis.call('ZREM', queue_key, id)
  redis.call('ZREM', deadlines_key, id)
  redis.call('HDEL', costs_key, id)
end

local function park(free, left, is_idle)
  if free > 0 and worker_id ~= '' then
    redis.call('HSET', terms_key, worker_id,
      free .. '|' .. left .. '|' .. is_idle .. '|' .. lease_ms .. '|' .. in_progress_ms)
    local last = redis.call('ZRANGE', parked_key, -1, -1, 'WITHSCORES')
    local at = now
    if last[1] and last[1] ~= worker_id then at = math.max(now, tonumber(last[2]) + 1) end
    redis.call('ZADD', parked_key, ms(at), worker_id)
    redis.call('PEXPIRE', parked_key, park_ttl_ms)
    redis.call('PEXPIRE', terms_key, park_ttl_ms)
  else
    redis.call('ZREM', parked_key, worker_id)
    redis.call('HDEL', terms_key, worker_id)
  end
end

local function reply(id, score, cost, job, try)
  local more = redis.call('ZCARD', queue_key) > 0
  local out = {id, score, cost, job or '', try or 0, more and '1' or '0'}
  for _, x in ipairs(expired) do table.insert(out, x) end
  table.insert(out, '|')
  for _, x in ipairs(cancelled) do table.insert(out, x) end
  return out
end

for _ = 1, 100 do
  local head = redis.call('ZRANGE', queue_key, 0, 0, 'WITHSCORES')
  if #head == 0 then
    park(free_slots, budget, idle)
    return reply('', '0', '0')
  end
  local id = head[1]
  local deadline = redis.call('ZSCORE', deadlines_key, id)
  if redis.call('EXISTS', cancel_prefix .. id) == 1 then
    drop(id)
    redis.call('DEL', job_prefix .. id)
    table.insert(cancelled, id)
  elseif deadline and tonumber(deadline) <= deadline_now then
    drop(id)
    redis.call('DEL', job_prefix .. id)
    table.insert(expired, id)
  else
    local cost = redis.call('HGET', costs_key, id) or '0'
    if budget >= 0 and idle ~= '1' and tonumber(cost) > budget then
      park(0)
      return reply('', '0', '0')
    end
    drop(id)
    local job = redis.call('GET', job_prefix .. id)
    local try = redis.call('INCR', retry_prefix .. id)
    redis.call('EXPIRE', retry_prefix .. id, retry_ttl)
    redis.call('ZADD', running_key, ms(now + lease_ms), id)
    redis.call('HSET', leases_key, id, head[2] .. ':' .. cost .. ':' .. try)
    redis.call('SET', in_progress_prefix .. id, '1', 'PX', in_progress_ms)
    if redis.call('ZCARD', queue_key) == 0 then
      park(free_slots - 1, budget < 0 and -1 or math.max(budget - cost, 0), '0')
    else
      park(0)
    end
    return reply(id, head[2], cost, job, try)
  end
end
return reply('', '0', '0')
