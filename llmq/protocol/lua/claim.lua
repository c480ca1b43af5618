-- Claim the lowest-scored request for a worker. Requests past their deadline or
-- cancelled are removed on the way and reported. The claimed request's job record
-- is read and its try counter bumped here, as arq's run_job would do in a round trip
-- of its own; the try number is the attempt, the fencing token of this run.
-- A worker that leaves the queue empty with a slot still free is *parked*: enqueue.lua
-- then hands it the next request directly. Parked terms: "free|budget|idle|lease
-- ms|in-progress ms|policy version" (the version this claim ran under: enqueue.lua
-- hands nothing to a worker parked under a version below its model's); the parked set is ordered by when the worker parked (each
-- newcomer, or a worker handed a request, goes to the back: workers take turns).
-- Reply: llmq.protocol.codec.parse_claim.
--
-- Routed (a policy's name in ARGV[19], llmq.protocol.routing; KEYS 13-18 given): instead
-- of the head, the worker takes from the queue's first `window` requests the one it wants
-- most (lua/affinity.lua: its cached prefix, its session, its load, its hash), and
-- leaves a request that another live worker wants more, unless a guard says the
-- request is anyone's now: it was left for another `max_wait_ms` ago (held_key: when
-- a claim or hand-off first left it), `max_overtakes` later requests
-- were taken before it, or it has no hint. A worker the load guard finds too busy
-- (lua/affinity.lua too_busy: fixed, more than `imbalance` running requests beyond
-- this one; adaptive, its wait for a slot longer than this worker's recompute of what
-- it holds) wants nothing here, and no request overtakes a
-- more urgent one (lower priority number) when the priority guard is on. A worker
-- that takes nothing is parked and told when the first request it left becomes
-- anyone's (the reply's retry ms).
-- Fair share (fairness 'vtc': lua/fair.lua): instead of the head, the claim takes the
-- first request of the tenant with the least counter among those with requests in the
-- head's priority band (the head's when it has no tenant); routed, the window is the
-- first requests of the tenants within `fair_slack` of the least counter, and affinity
-- chooses among them. The claimed request's tenant is charged its prompt + max_tokens
-- divided by its weight.
-- KEYS and ARGV: llmq.protocol.slots.Claim (routed: and ClaimRoute).
local queue_key = KEYS[1]
local running_key = KEYS[2]
local costs_key = KEYS[3]
local deadlines_key = KEYS[4]
local leases_key = KEYS[5]
local parked_key = KEYS[6]
local terms_key = KEYS[7]
local clock_key = KEYS[8]
local fair_key = KEYS[9]
local vtc_key = KEYS[10]
local tenants_key = KEYS[11]

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
local fairness = ARGV[14]
local fair_slack = tonumber(ARGV[15])
local fairq_prefix = ARGV[16]
local policy_key = KEYS[12]
local policy_version = tonumber(ARGV[17])
-- '1': the worker traces its runs; the reply then says where the claimed request
-- stood (`overtook`, `held_ms`, `released_by`, below: its llmq.queue_wait span's).
local traced = ARGV[18] == '1'

-- The claim runs under the pool policy the worker holds (its routing, fair share):
-- one older than the model's (policy_key, raised after each change) is refused, and
-- the worker reads the policy again and claims again (llmq.protocol.queue). -1: the
-- caller holds no pool policy (tools, tests of the claim itself).
if policy_version >= 0 then
  local floor = tonumber(redis.call('GET', policy_key) or '0')
  if policy_version < floor then
    return {'!stale', floor}
  end
end

-- Routed only (nil under fifo):
local routes_key = KEYS[13]
local overtaken_key = KEYS[14]
local loads_key = KEYS[15]
local beats_key = KEYS[16]
local stats_key = KEYS[17]
local held_key = KEYS[18]
local policy_name = ARGV[19]
local window = tonumber(ARGV[20])
local max_wait_ms = tonumber(ARGV[21])
local max_overtakes = tonumber(ARGV[22])
local imbalance = tonumber(ARGV[23])
local priority_guard = ARGV[24] == '1'
local running = tonumber(ARGV[25])
local capacity = tonumber(ARGV[26])
local cache_prefix = ARGV[27]
local session_prefix = ARGV[28]
local session_ttl_ms = ARGV[29]
local live_ms = tonumber(ARGV[30])
local max_workers = tonumber(ARGV[31])

local routed = policy_name ~= nil
local route, mine
if routed then
  -- This worker's load as it claims, with the pace its last routing beat published.
  mine = parse_load(redis.call('HGET', loads_key, worker_id))
  mine[1], mine[2] = running, capacity
  route = route_of(policy_name, cache_prefix, session_prefix, loads_key, beats_key, live_ms,
    max_workers, imbalance)
end

local now = lease_now(clock_key)
if routed then
  route.now = now
end
local expired, cancelled = {}, {}
local retry_ms = 0
-- Of a routed claim under a policy that caches (prefix): how many of the claimed
-- request's leading blocks the claimer held; -1: not known.
local matched = -1
-- Traced only: requests queued ahead of the claimed one (a lower score) that it went
-- before (by its tenant's turn, or for this worker's cache); how long it had been left
-- to a busy worker that holds its prefix; and the guard that made it anyone's
-- (guard_wait, guard_overtakes, guard_load; '' none).
local overtook, held_ms, released_by = -1, -1, ''

local function drop(id)
  redis.call('ZREM', queue_key, id)
  redis.call('ZREM', deadlines_key, id)
  redis.call('HDEL', costs_key, id)
  if routed then
    redis.call('HDEL', routes_key, id)
    redis.call('HDEL', overtaken_key, id)
    redis.call('HDEL', held_key, id)
  end
end

-- Drops a request that was cancelled or is past its deadline, and reports it in the
-- reply; true if it did. The head of the queue and a routed choice are both checked.
local function gone(id)
  local deadline = redis.call('ZSCORE', deadlines_key, id)
  local into
  if redis.call('EXISTS', cancel_prefix .. id) == 1 then
    into = cancelled
  elseif deadline and tonumber(deadline) <= deadline_now then
    into = expired
  else
    return false
  end
  drop(id)
  redis.call('HDEL', fair_key, id, CHARGED .. id)
  redis.call('DEL', job_prefix .. id)
  table.insert(into, id)
  return true
end

local function park(free, left, is_idle)
  if free > 0 and worker_id ~= '' then
    redis.call('HSET', terms_key, worker_id,
      free .. '|' .. left .. '|' .. is_idle .. '|' .. lease_ms .. '|' .. in_progress_ms
        .. '|' .. policy_version)
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

local function reply(id, score, cost, job, attempt)
  local more = redis.call('ZCARD', queue_key) > 0
  local out = {id, score, cost, job or '', attempt or 0, more and '1' or '0', retry_ms,
    matched, overtook, held_ms, released_by}
  for _, x in ipairs(expired) do table.insert(out, x) end
  table.insert(out, '|')
  for _, x in ipairs(cancelled) do table.insert(out, x) end
  return out
end

local fair_on = fairness == 'vtc'
local fair_least = nil

local function take(id, score, cost)
  if traced then
    overtook = redis.call('ZCOUNT', queue_key, '-inf', '(' .. score)
  end
  if fair_on then
    fair_charge(fair_key, vtc_key, fairq_prefix, id, cost, fair_least)
  end
  drop(id)
  local job = redis.call('GET', job_prefix .. id)
  local attempt = redis.call('INCR', retry_prefix .. id)
  redis.call('EXPIRE', retry_prefix .. id, retry_ttl)
  redis.call('ZADD', running_key, ms(now + lease_ms), id)
  redis.call('HSET', leases_key, id, score .. ':' .. cost .. ':' .. attempt)
  redis.call('SET', in_progress_prefix .. id, '1', 'PX', in_progress_ms)
  if redis.call('ZCARD', queue_key) == 0 then
    park(free_slots - 1, budget < 0 and -1 or math.max(budget - cost, 0), '0')
  else
    park(0)
  end
  return reply(id, score, cost, job, attempt)
end

-- The routed choice among the window (see the top). Returns the position to take or
-- nil, the window's ids and scores, the hint of each, what each wants, the guard that
-- made the chosen one anyone's (nil: none) and when each was first left to a holder.
local function choose()
  local raw = redis.call('ZRANGE', queue_key, 0, window - 1, 'WITHSCORES')
  local ids, scores = {}, {}
  for i = 1, #raw, 2 do
    ids[#ids + 1] = raw[i]
    scores[#scores + 1] = raw[i + 1]
  end
  if fair_on and #ids > 0 then
    local fair_ids, fair_scores, least = fair_window(queue_key, fair_key, vtc_key,
      tenants_key, fairq_prefix, ids[1], scores[1], fair_slack, window)
    if fair_ids then
      ids, scores, fair_least = fair_ids, fair_scores, least
    end
  end
  local hints = redis.call('HMGET', routes_key, unpack(ids))
  local overtakes = redis.call('HMGET', overtaken_key, unpack(ids))
  local held_since = redis.call('HMGET', held_key, unpack(ids))
  local live, loads = live_workers(route)
  local others = {}
  for _, w in ipairs(live) do
    if w ~= worker_id then
      table.insert(others, w)
    end
  end
  -- Requests this claim leaves to each worker, ahead of the next one it looks at.
  local ahead = {}
  local wants = {}
  local chosen, gain, why = nil, -1, nil
  local urgent = nil
  local held, outranked_wanted = false, false
  for i, id in ipairs(ids) do
    local hint = parse_hint(hints[i])
    local forced = nil
    local want, best, best_busy, holder = 0, nil, nil, nil
    if not hint then
      forced = 'none'
    else
      if held_since[i] and deadline_now - tonumber(held_since[i]) >= max_wait_ms then
        forced = 'guard_wait'
      elseif tonumber(overtakes[i] or '0') >= max_overtakes then
        forced = 'guard_overtakes'
      end
      local last = session_worker(route, hint)
      want = rank(route, worker_id, hint, last, mine)
      wants[i] = want
      for _, w in ipairs(others) do
        local r = rank(route, w, hint, last, loads[w])
        if r > want and route.policy.holds and too_busy(route, loads[w], mine,
            route.policy.saved(hint, r, want), ahead[w] or 0) then
          if best_busy == nil or r > best_busy then best_busy = r end
        elseif best == nil or r > best then
          best, holder = r, w
        end
      end
    end
    if priority_guard and hint and urgent and hint.priority > urgent then
      -- would overtake a more urgent request: not a candidate
      if route.policy.gains and want > gain and want > 0 then outranked_wanted = true end
    else
      local wanted = best == nil or want >= best
      if wanted or forced then
        local g = (route.policy.gains and wanted) and want or 0
        if chosen == nil or g > gain then
          chosen, gain = i, g
          why = nil
          if not wanted then
            why = forced
          elseif best_busy ~= nil and best_busy > want then
            why = 'guard_load'
          end
        end
        if forced then
          break  -- nothing after a request that is anyone's may overtake it
        end
      else
        held = true
        ahead[holder] = (ahead[holder] or 0) + 1
        local since = tonumber(held_since[i] or '0')
        if since == 0 then
          since = deadline_now
          redis.call('HSET', held_key, id, ms(since))
        end
        local left = since + max_wait_ms - deadline_now
        if retry_ms == 0 or left < retry_ms then retry_ms = math.max(left, 1) end
      end
    end
    if hint and (urgent == nil or hint.priority < urgent) then
      urgent = hint.priority
    end
  end
  if held then
    redis.call('HINCRBY', stats_key, 'held', 1)
  end
  if outranked_wanted then
    redis.call('HINCRBY', stats_key, 'guard_priority', 1)
  end
  if chosen ~= nil and why ~= nil and why ~= 'none' then
    redis.call('HINCRBY', stats_key, why, 1)
  end
  return chosen, ids, scores, hints, wants, why, held_since
end

local function routed_claim()
  local i, ids, scores, hints, wants, why, held_since = choose()
  if i == nil then
    redis.call('HSET', loads_key, worker_id, load_text(mine))
    park(free_slots, budget, idle)
    return reply('', '0', '0')
  end
  local id = ids[i]
  if gone(id) then
    return nil
  end
  if traced and why and why ~= 'none' then
    released_by = why
  end
  local cost = redis.call('HGET', costs_key, id) or '0'
  if i > 1 then
    if budget >= 0 and idle ~= '1' and tonumber(cost) > budget then
      i, id, cost = 1, ids[1], redis.call('HGET', costs_key, ids[1]) or '0'
      released_by = ''
    else
      redis.call('HINCRBY', stats_key, 'affinity', 1)
      for j = 1, i - 1 do
        redis.call('HINCRBY', overtaken_key, ids[j], 1)
      end
    end
  end
  if traced and held_since[i] then
    held_ms = math.max(deadline_now - tonumber(held_since[i]), 0)
  end
  local hint = parse_hint(hints[i])
  if hint and route.policy.caches then
    -- the prefix rank: the blocks held, plus all of them and one for the session's
    -- last worker (lua/affinity.lua)
    local want = wants[i] or 0
    matched = want > #hint.blocks and want - #hint.blocks - 1 or want
  end
  remember(route, hint, worker_id, session_ttl_ms)
  redis.call('HSET', loads_key, worker_id,
    load_text({running + 1, capacity, mine[3], mine[4]}))
  return take(id, scores[i], cost)
end

for _ = 1, 100 do
  local head = redis.call('ZRANGE', queue_key, 0, 0, 'WITHSCORES')
  if #head == 0 then
    if routed then
      redis.call('HSET', loads_key, worker_id, load_text(mine))
    end
    park(free_slots, budget, idle)
    return reply('', '0', '0')
  end
  local id, score = head[1], head[2]
  local here = not gone(id)
  if here and fair_on and not routed then
    local ids, scores, least = fair_window(queue_key, fair_key, vtc_key, tenants_key,
      fairq_prefix, id, score, 0, 1)
    if ids then
      id, score, fair_least = ids[1], scores[1], least
      here = id == head[1] or not gone(id)
    end
  end
  if here then
    local cost = redis.call('HGET', costs_key, id) or '0'
    if budget >= 0 and idle ~= '1' and tonumber(cost) > budget then
      park(0)
      return reply('', '0', '0')
    end
    if not routed then
      return take(id, score, cost)
    end
    local out = routed_claim()
    if out then
      return out
    end
  end
end
return reply('', '0', '0')
