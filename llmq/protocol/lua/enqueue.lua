-- Add a request unless the queue is full; hand it to a parked worker if one waits.
-- Returns 0 when the queue is full, 1 when queued, 2 when handed to a parked worker,
-- 3 when its tenant's quota was not taken (quota_held, below).
-- Every key is in the model's slot; the request's record and lifecycle note are
-- written before this by record.lua (see llmq.protocol.queue.Queue.admit for the order).
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
-- A hand-off is a claim, and runs under one version of the pool policy as claim.lua's
-- do: the API's (policy_version, whose routing made the hint and whose fair share the
-- entry) and the parked worker's (the version in its terms, which its claim parked
-- under) must both be at least the model's version floor (policy_key); else the
-- request is queued, and a worker parked under an older version is unparked (its
-- claim, refused as stale until it has read the policy again, lua/claim.lua, parks it
-- again). -1: the caller holds no pool policy.
--
-- Routed (a policy's name in ARGV[17], llmq.protocol.routing; KEYS 15-18 given): the request's
-- route hint is kept beside its queue entry for claim.lua, and the hand-off goes to the
-- parked worker that wants it most (lua/affinity.lua), among holders alike the least
-- loaded, else the first parked, and not a parked one the load guard finds too busy
-- (lua/affinity.lua too_busy) for its cache; if a live worker that is not parked wants
-- it more (it holds the prefix) and the load guard does not find it too busy against
-- that parked worker, the request is queued for it instead (when `max_wait_ms` > 0):
-- the holder claims it when a slot frees, anyone once it waited `max_wait_ms`.
-- Fair share (fair_entry "tenant|weight|priority", '' when off: lua/fair.lua): the
-- request's tenant is kept beside its queue entry, and a tenant that was idle is lifted
-- to the least counter of the backlogged tenants, less its credit (fair_enqueue).
-- Quota (quota_held, '' when not checked): on a single Redis the tenant's quota is taken
-- (quota_take.lua) in the same pipeline just before this call, and quota_held names the
-- tenant's reservations hash (in the tenant's slot: never set on a Cluster, where the
-- take is a round trip of its own): without the request's reservation there, nothing is
-- written and the reply is 3.
-- KEYS and ARGV: llmq.protocol.slots.Enqueue (routed: and EnqueueRoute).
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
local fair_key = KEYS[11]
local vtc_key = KEYS[12]
local tenants_key = KEYS[13]
local policy_key = KEYS[14]

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
local fair_entry = ARGV[13]
local fairq_prefix = ARGV[14]
local quota_held = ARGV[15]
local policy_version = tonumber(ARGV[16])

-- Routed only (nil under fifo, or for a request without a hint):
local routes_key = KEYS[15]
local loads_key = KEYS[16]
local stats_key = KEYS[17]
local held_key = KEYS[18]
local policy_name = ARGV[17]
local hint_text = ARGV[18]
local cache_prefix = ARGV[19]
local session_prefix = ARGV[20]
local session_ttl_ms = ARGV[21]
local imbalance = tonumber(ARGV[22])
local max_workers = tonumber(ARGV[23])
local max_wait_ms = tonumber(ARGV[24])
local live_ms = tonumber(ARGV[25])
local now_ms = ARGV[26]

local routed = policy_name ~= nil
local hint, route
if routed then
  hint = parse_hint(hint_text)
  route = route_of(policy_name, cache_prefix, session_prefix, loads_key, beats_key, live_ms,
    max_workers, imbalance)
end

if quota_held ~= '' and redis.call('HEXISTS', quota_held, id) == 0 then
  return 3
end
if live_depth(queue_key) >= max_depth then
  return 0
end
redis.call('SET', job_key, job, 'PX', ttl_ms)

local function unpark(w)
  redis.call('ZREM', parked_key, w)
  redis.call('HDEL', terms_key, w)
end

-- Claim the request for parked worker w and publish it on w's channel; false if
-- nobody listens there (w is unparked).
local function hand_to(w, now, free, budget, lease, held, version)
  local message = id .. '|' .. score .. '|' .. cost .. '|1|' .. job
  if redis.call('PUBLISH', handoff_prefix .. w, message) == 0 then
    unpark(w)
    return false
  end
  redis.call('ZADD', running_key, ms(now + tonumber(lease)), id)
  redis.call('HSET', leases_key, id, score .. ':' .. cost .. ':1')
  redis.call('SET', in_progress_prefix .. id, '1', 'PX', held)
  redis.call('SET', retry_prefix .. id, '1', 'EX', retry_ttl)
  if fair_entry ~= '' then
    fair_handed(fair_key, vtc_key, id, fair_entry, cost, ttl_ms)
  end
  if tonumber(free) > 1 then
    local left = tonumber(budget) < 0 and -1 or math.max(tonumber(budget) - tonumber(cost), 0)
    redis.call('HSET', terms_key, w,
      (free - 1) .. '|' .. left .. '|0|' .. lease .. '|' .. held .. '|' .. version)
    local last = redis.call('ZRANGE', parked_key, -1, -1, 'WITHSCORES')
    redis.call('ZADD', parked_key, ms(math.max(now, tonumber(last[2]) + 1)), w)
  else
    unpark(w)
  end
  return true
end

-- Parked worker w's terms {w, free, budget, lease, held, version} if it could take
-- the request now; nil if not, and an entry that is stale (by its heartbeat, or
-- parked under a policy version below `floor`) or malformed is unparked.
local function taker(w, now, floor)
  local terms = redis.call('HGET', terms_key, w)
  local free, budget, idle, lease, held, version
  if terms then
    free, budget, idle, lease, held, version =
      string.match(terms, '^(%d+)|(-?%d+)|(%d)|(%d+)|(%d+)|(-?%d+)$')
    if not free then  -- parked by a worker of the release before, which named no version
      free, budget, idle, lease, held = string.match(terms, '^(%d+)|(-?%d+)|(%d)|(%d+)|(%d+)$')
      version = '-1'
    end
  end
  local beat = tonumber(redis.call('ZSCORE', beats_key, w) or '0')
  if not free or now - beat > tonumber(lease)
      or (tonumber(version) >= 0 and tonumber(version) < floor) then
    unpark(w)  -- a live one parks again with its next claim, under the policy read again
  elseif idle == '1' or tonumber(budget) < 0 or tonumber(cost) <= tonumber(budget) then
    return {w, free, budget, lease, held, version}
  end
  return nil
end

-- Routed: the takers by how much each wants the request, then (among workers that
-- want it alike, for their cache or session) by load, fewer running first, then in
-- parked order: a prompt nobody holds goes where FIFO would send it. None if a busy
-- live worker wants it more and the load guard does not find it too busy (see the
-- top). A parked worker the load guard finds too busy, against the least loaded
-- parked one, is not preferred for its cache (fixed: running more than `imbalance`
-- beyond it; adaptive: a parked worker has a free slot, so never): a shared prefix
-- can carry any share of the traffic and spreads; the session's last worker keeps it
-- (a session sends one request at a time, so following it never piles load up).
local function routed_order(now, found)
  route.now = now
  local live, loads = live_workers(route)
  local last = session_worker(route, hint)
  local parked_here, ranks = {}, {}
  local least = nil
  for _, t in ipairs(found) do
    parked_here[t[1]] = true
    local load = loads[t[1]] or parse_load(nil)
    if least == nil or load[1] < least[1] then least = load end
  end
  local demoted = false
  for i, t in ipairs(found) do
    local load = loads[t[1]] or parse_load(nil)
    local r = rank(route, t[1], hint, last, load)
    if route.policy.holds and r > 0 and t[1] ~= last
        and too_busy(route, load, least, route.policy.saved(hint, r, 0), 0) then
      r, demoted = 0, true
    end
    ranks[i] = {r, i, t, load[1]}
  end
  table.sort(ranks, function(a, b)
    if a[1] ~= b[1] then return a[1] > b[1] end
    if a[1] > 0 and a[4] ~= b[4] then return a[4] < b[4] end
    return a[2] < b[2]
  end)
  local top = ranks[1]
  if demoted and top[1] == 0 then
    redis.call('HINCRBY', stats_key, 'guard_load', 1)
  end
  if max_wait_ms > 0 and route.policy.holds then
    local top_load = loads[top[3][1]] or parse_load(nil)
    for _, w in ipairs(live) do
      local r = not parked_here[w] and rank(route, w, hint, last, loads[w])
      if r and r > top[1]
          and not too_busy(route, loads[w], top_load, route.policy.saved(hint, r, top[1]), 0) then
        redis.call('HINCRBY', stats_key, 'handoff_held', 1)
        redis.call('HSET', held_key, id, now_ms)
        redis.call('PEXPIRE', held_key, ttl_ms)
        return {}
      end
    end
  end
  local first = nil
  for _, r in ipairs(ranks) do
    if r[2] == 1 then first = r[1] end
  end
  if top[1] > first then
    redis.call('HINCRBY', stats_key, 'handoff_affinity', 1)
  end
  local out = {}
  for i, r in ipairs(ranks) do out[i] = r[3] end
  return out
end

local handing = redis.call('ZCARD', queue_key) == 0 and redis.call('ZCARD', parked_key) > 0
local floor = handing and tonumber(redis.call('GET', policy_key) or '0') or 0
if handing and (policy_version < 0 or policy_version >= floor) then
  local now = lease_now(clock_key)
  if not (routed and hint) then
    for _, w in ipairs(redis.call('ZRANGE', parked_key, 0, 15)) do
      local t = taker(w, now, floor)
      if t and hand_to(w, now, t[2], t[3], t[4], t[5], t[6]) then
        return 2
      end
    end
  else
    local found = {}
    for _, w in ipairs(redis.call('ZRANGE', parked_key, 0, 15)) do
      local t = taker(w, now, floor)
      if t then table.insert(found, t) end
    end
    if #found > 0 then
      found = routed_order(now, found)
    end
    for _, t in ipairs(found) do
      if hand_to(t[1], now, t[2], t[3], t[4], t[5], t[6]) then
        remember(route, hint, t[1], session_ttl_ms)
        local raw = redis.call('HGET', loads_key, t[1])
        if raw then
          local load = parse_load(raw)
          load[1] = load[1] + 1
          redis.call('HSET', loads_key, t[1], load_text(load))
        end
        return 2
      end
    end
  end
end
redis.call('ZADD', queue_key, score, id)
if fair_entry ~= '' then
  fair_enqueue(fair_key, vtc_key, tenants_key, fairq_prefix, id, score, fair_entry, ttl_ms)
end
redis.call('HSET', costs_key, id, cost)
redis.call('ZADD', deadlines_key, deadline_ms, id)
if routed and hint then
  redis.call('HSET', routes_key, id, hint_text)
  redis.call('PEXPIRE', routes_key, ttl_ms)
end
-- the wake-up names the request's tenant, if it has one: a full worker that was told
-- only that tenant's requests wait need not ask fair_yield.lua again
local woken = id
if fair_entry ~= '' then
  woken = id .. '|' .. (fair_parse(fair_entry) or '')
end
redis.call('PUBLISH', wake_channel, woken)
return 1
