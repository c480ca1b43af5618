"""The Lua scripts that make every queue transition atomic.

Keys are passed where a script touches a fixed set of them; scripts that work
across models (the deadline sweep) build key names from prefixes, which is fine
on a single Redis node (llmq does not target Redis Cluster).

A queued request lives in three places, always changed together: the model's
queue (sorted set, score = effective start time), the model's cost hash (prompt +
max_tokens, for token-aware admission) and the global deadline set (member
``<id>:<model>``, score = queue deadline in ms).
"""

#: KEYS: queue, job, record, costs, deadlines, lifecycle, attached, parked, parked
#: terms, running, leases.
#: ARGV: id, score, job, ttl_ms, max_depth, wake channel, cost, deadline_ms,
#: deadline member, lifecycle maxlen, model, lifecycle data, attach ('1': add the
#: deadline member to the API process's attached set), now_ms, handoff channel
#: prefix, in-progress prefix, retry prefix, retry ttl s, then record field/value
#: pairs. 0 when the queue is full, 1 when queued, 2 when handed to a parked worker.
#:
#: The hand-off: when the queue is empty and a worker is parked (see CLAIM), the
#: request is claimed for that worker here and published to its own channel with
#: everything CLAIM would have returned, so it starts without a claim round trip.
#: PUBLISH counts the receivers: a worker that is not listening (dead, reconnecting)
#: is unparked and the next one tried; with none, the request is queued as usual.
ENQUEUE = """
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[5]) then
  return 0
end
if ARGV[13] == '1' then
  redis.call('SADD', KEYS[7], ARGV[9])
end
redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
redis.call('HSET', KEYS[3], unpack(ARGV, 19))
redis.call('PEXPIRE', KEYS[3], ARGV[4])
redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[10], '*', 'event', 'queued',
  'request_id', ARGV[1], 'model', ARGV[11], 'data', ARGV[12])
local function unpark(w)
  redis.call('ZREM', KEYS[8], w)
  redis.call('HDEL', KEYS[9], w)
end
if redis.call('ZCARD', KEYS[1]) == 0 then
  local now, cost = tonumber(ARGV[14]), tonumber(ARGV[7])
  for _, w in ipairs(redis.call('ZRANGE', KEYS[8], 0, 15)) do
    local terms = redis.call('HGET', KEYS[9], w)
    local free, budget, idle, lease, held
    if terms then
      free, budget, idle, lease, held = string.match(terms, '^(%d+)|(-?%d+)|(%d)|(%d+)|(%d+)$')
    end
    if not free then
      unpark(w)
    elseif idle == '1' or tonumber(budget) < 0 or cost <= tonumber(budget) then
      local message = ARGV[1] .. '|' .. ARGV[2] .. '|' .. ARGV[7] .. '|1|' .. ARGV[3]
      if redis.call('PUBLISH', ARGV[15] .. w, message) > 0 then
        redis.call('ZADD', KEYS[10], now + tonumber(lease), ARGV[1])
        redis.call('HSET', KEYS[11], ARGV[1], ARGV[2] .. ':' .. ARGV[7])
        redis.call('SET', ARGV[16] .. ARGV[1], '1', 'PX', held)
        redis.call('SET', ARGV[17] .. ARGV[1], '1', 'EX', ARGV[18])
        if tonumber(free) > 1 then
          local left = tonumber(budget) < 0 and -1 or math.max(tonumber(budget) - cost, 0)
          redis.call('HSET', KEYS[9], w,
            (free - 1) .. '|' .. left .. '|0|' .. lease .. '|' .. held)
          local last = redis.call('ZRANGE', KEYS[8], -1, -1, 'WITHSCORES')
          redis.call('ZADD', KEYS[8], math.max(now, tonumber(last[2]) + 1), w)
        else
          unpark(w)
        end
        return 2
      end
      unpark(w)
    end
  end
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('HSET', KEYS[4], ARGV[1], ARGV[7])
redis.call('ZADD', KEYS[5], ARGV[8], ARGV[9])
redis.call('PUBLISH', ARGV[6], ARGV[1])
return 1
"""

#: KEYS: queue, running, costs, deadlines, leases, parked, parked terms.
#: ARGV: now_ms, lease_ms, in-progress prefix, in-progress ttl ms, budget left (-1: no
#: budget), idle ('1' if the worker runs nothing), model, job prefix, cancel prefix,
#: retry prefix, retry ttl s, worker id, free slots (before this claim), park ttl ms.
#: Takes the lowest-scored request; requests past their deadline or cancelled are
#: removed on the way and reported. The claimed request's job record is read and its
#: try counter bumped here, as arq's run_job would do in a round trip of its own.
#: A worker that leaves the queue empty with a slot still free is *parked*: ENQUEUE
#: then hands it the next request directly. Parked terms: "free|budget|idle|lease
#: ms|in-progress ms"; the parked set is ordered by when the worker parked (each
#: newcomer, or a worker handed a request, goes to the back: workers take turns).
#: Returns {id, score, cost, job ('' if gone), try, more ('1': the queue still holds
#: requests), expired..., '|', cancelled...}; id is '' when nothing was claimed.
CLAIM = """
local now = tonumber(ARGV[1])
local expired, cancelled = {}, {}
local function drop(id, member)
  redis.call('ZREM', KEYS[1], id)
  redis.call('ZREM', KEYS[4], member)
  redis.call('HDEL', KEYS[3], id)
end
local function park(free, budget, idle)
  if free > 0 and ARGV[12] ~= '' then
    redis.call('HSET', KEYS[7], ARGV[12],
      free .. '|' .. budget .. '|' .. idle .. '|' .. ARGV[2] .. '|' .. ARGV[4])
    local last = redis.call('ZRANGE', KEYS[6], -1, -1, 'WITHSCORES')
    local at = now
    if last[1] and last[1] ~= ARGV[12] then at = math.max(now, tonumber(last[2]) + 1) end
    redis.call('ZADD', KEYS[6], at, ARGV[12])
    redis.call('PEXPIRE', KEYS[6], ARGV[14])
    redis.call('PEXPIRE', KEYS[7], ARGV[14])
  else
    redis.call('ZREM', KEYS[6], ARGV[12])
    redis.call('HDEL', KEYS[7], ARGV[12])
  end
end
local function reply(id, score, cost, job, try)
  local more = redis.call('ZCARD', KEYS[1]) > 0
  local out = {id, score, cost, job or '', try or 0, more and '1' or '0'}
  for _, x in ipairs(expired) do table.insert(out, x) end
  table.insert(out, '|')
  for _, x in ipairs(cancelled) do table.insert(out, x) end
  return out
end
for _ = 1, 100 do
  local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if #head == 0 then
    park(tonumber(ARGV[13]), ARGV[5], ARGV[6])
    return reply('', '0', '0')
  end
  local id = head[1]
  local member = id .. ':' .. ARGV[7]
  local deadline = redis.call('ZSCORE', KEYS[4], member)
  if redis.call('EXISTS', ARGV[9] .. id) == 1 then
    drop(id, member)
    redis.call('DEL', ARGV[8] .. id)
    table.insert(cancelled, id)
  elseif deadline and tonumber(deadline) <= now then
    drop(id, member)
    redis.call('DEL', ARGV[8] .. id)
    table.insert(expired, id)
  else
    local cost = redis.call('HGET', KEYS[3], id) or '0'
    local budget = tonumber(ARGV[5])
    if budget >= 0 and ARGV[6] ~= '1' and tonumber(cost) > budget then
      park(0)
      return reply('', '0', '0')
    end
    drop(id, member)
    redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), id)
    redis.call('HSET', KEYS[5], id, head[2] .. ':' .. cost)
    redis.call('SET', ARGV[3] .. id, '1', 'PX', ARGV[4])
    local job = redis.call('GET', ARGV[8] .. id)
    local try = redis.call('INCR', ARGV[10] .. id)
    redis.call('EXPIRE', ARGV[10] .. id, ARGV[11])
    if redis.call('ZCARD', KEYS[1]) == 0 then
      park(tonumber(ARGV[13]) - 1, budget < 0 and -1 or math.max(budget - cost, 0), '0')
    else
      park(0)
    end
    return reply(id, head[2], cost, job, try)
  end
end
return reply('', '0', '0')
"""

#: KEYS: queue, running, costs, leases. ARGV: id, score, cost, wake channel.
#: Puts a claimed request back at its old place (its worker is stopping).
REQUEUE = """
redis.call('HDEL', KEYS[4], ARGV[1])
if redis.call('ZREM', KEYS[2], ARGV[1]) == 1 then
  redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
  redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
  redis.call('PUBLISH', ARGV[4], ARGV[1])
  return 1
end
return 0
"""

#: KEYS: queue, costs, deadlines, job, cancel flag.
#: ARGV: id, deadline member, flag ttl ms, cancel channel.
#: 1: it was queued and is gone. 0: not queued (running or finished): the flag is
#: set and the workers are told, so whoever runs or re-claims it stops.
CANCEL = """
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[3], ARGV[2])
  redis.call('DEL', KEYS[4])
  return 1
end
redis.call('SET', KEYS[5], '1', 'PX', ARGV[3])
redis.call('PUBLISH', ARGV[4], ARGV[1])
return 0
"""

#: KEYS: deadlines. ARGV: now_ms, limit, queue prefix, costs prefix, job prefix.
#: Removes queued requests whose deadline passed; returns their ids.
SWEEP = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
local out = {}
for _, member in ipairs(due) do
  redis.call('ZREM', KEYS[1], member)
  local sep = string.find(member, ':', 1, true)
  if sep then
    local id = string.sub(member, 1, sep - 1)
    local model = string.sub(member, sep + 1)
    if redis.call('ZREM', ARGV[3] .. model, id) == 1 then
      redis.call('HDEL', ARGV[4] .. model, id)
      redis.call('DEL', ARGV[5] .. id)
      table.insert(out, id)
    end
  end
end
return out
"""

#: KEYS: running. ARGV: expiry_ms, ids... Extends the leases this worker still holds
#: (XX: a lease that was already reaped is not resurrected).
RENEW = """
local n = 0
for i = 2, #ARGV do
  n = n + redis.call('ZADD', KEYS[1], 'XX', 'CH', ARGV[1], ARGV[i])
end
return n
"""

#: KEYS: running, queue, leases, costs. ARGV: now_ms, limit, wake channel,
#: in-progress prefix. Requests whose lease expired (their worker died) go back to
#: the queue at their original score; returns their ids.
REAP = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
for _, id in ipairs(due) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('DEL', ARGV[4] .. id)
  local lease = redis.call('HGET', KEYS[3], id)
  redis.call('HDEL', KEYS[3], id)
  if lease then
    local sep = string.find(lease, ':', 1, true)
    redis.call('ZADD', KEYS[2], string.sub(lease, 1, sep - 1), id)
    redis.call('HSET', KEYS[4], id, string.sub(lease, sep + 1))
  end
end
if #due > 0 then
  redis.call('PUBLISH', ARGV[3], 'reaped')
end
return due
"""

#: KEYS: apis. ARGV: now_ms, attached prefix, limit.
#: Takes (SPOP) up to ``limit`` attached requests of API processes whose lease ran
#: out, and forgets a dead process once it has none left; returns the members
#: (``<id>:<model>``) for the caller to cancel.
ORPHANS = """
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, 10)
local out = {}
local left = tonumber(ARGV[3])
for _, pid in ipairs(dead) do
  local key = ARGV[2] .. pid
  if left > 0 then
    for _, m in ipairs(redis.call('SPOP', key, left)) do
      table.insert(out, m)
      left = left - 1
    end
  end
  if redis.call('SCARD', key) == 0 then
    redis.call('ZREM', KEYS[1], pid)
  end
end
return out
"""


#: Several ENQUEUE calls as one atomic step, all or none: KEYS and ARGV are those of
#: each call in turn. ARGV: n (calls), max_depth, then per call its key count and
#: argument count; KEYS[1] is the queue. The batch is refused (0) unless the queue
#: has room for all n, and otherwise each call runs ENQUEUE itself (the same text,
#: as a function of its own KEYS and ARGV). Returns 0, or 1 when all were admitted.
ENQUEUE_BATCH = (
    "local function enqueue_one(KEYS, ARGV)\n"
    + ENQUEUE
    + """
end
local n, max_depth = tonumber(ARGV[1]), tonumber(ARGV[2])
if redis.call('ZCARD', KEYS[1]) + n > max_depth then
  return 0
end
local k, a = 0, 2 + 2 * n
for i = 1, n do
  local nkeys, nargs = tonumber(ARGV[1 + 2 * i]), tonumber(ARGV[2 + 2 * i])
  local ks, as = {}, {}
  for j = 1, nkeys do ks[j] = KEYS[k + j] end
  for j = 1, nargs do as[j] = ARGV[a + j] end
  k, a = k + nkeys, a + nargs
  if enqueue_one(ks, as) == 0 then
    return redis.error_reply('ENQUEUE refused a request of an admitted batch')
  end
end
return 1
"""
)
