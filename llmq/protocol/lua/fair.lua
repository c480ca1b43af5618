-- Fair share among tenants within a priority band (VTC: Sheng et al., OSDI 2024),
-- kept beside a model's queue in its slot; prepended to the scripts that keep, charge or
-- drop a request's entries (llmq.protocol.scripts.FAIR). Keys (llmq.protocol.keys):
-- fair_key, hash of request id -> "tenant|weight|priority", from enqueue to release;
-- tenants_key, the set of tenants with requests queued; fairq_prefix..tenant, a sorted
-- set per tenant of its queued request ids (scored as in the queue; an id no longer
-- queued is dropped when met);
-- vtc_key, hash of 't:'..tenant -> its virtual counter (the tokens of the requests it
-- was served, divided by its weight) and '_floor', the least counter of the backlogged
-- tenants at the last claim. A claim charges a request's reservation (prompt +
-- max_tokens), kept in fair_key as CHARGED..id; the release of its run settles it to
-- the tokens the request used (fair_settle). A request claimed again (handed back,
-- or its worker died) replaces its earlier charge, so it is charged once in all.

local function fair_parse(entry)
  if not entry then return nil end
  local t, w, p = string.match(entry, '^([^|]*)|([^|]+)|(-?%d+)$')
  if not t then return nil end
  return t, tonumber(w), tonumber(p)
end

local function fair_counter(vtc_key, tenant)
  return tonumber(redis.call('HGET', vtc_key, 't:' .. tenant) or '0')
end

-- A tenant's recent service is counted in periods of this many ms, the current one and
-- the one before: long enough to hold many of a light tenant's requests, short enough
-- that what a tenant did not use is credited for seconds, not banked.
local RECENT_MS = 15000

local function fair_now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A tenant's tokens of the current and the previous period, as of `now`.
local function fair_periods(vtc_key, tenant, now)
  local p = math.floor(now / RECENT_MS)
  local raw = redis.call('HGET', vtc_key, 'r:' .. tenant)
  if not raw then return p, 0, 0 end
  local at, cur, prev = string.match(raw, '^(%d+)|([^|]+)|(.+)$')
  at, cur, prev = tonumber(at), tonumber(cur), tonumber(prev)
  if at == p then return p, cur, prev end
  if at == p - 1 then return p, 0, cur end
  return p, 0, 0
end

local function fair_recent_add(vtc_key, tenant, tokens)
  local p, cur, prev = fair_periods(vtc_key, tenant, fair_now_ms())
  redis.call('HSET', vtc_key, 'r:' .. tenant, p .. '|' .. (cur + tokens) .. '|' .. prev)
end

-- A tenant's weighted tokens charged over the last RECENT_MS (the previous period
-- counted for the part of it still that recent).
local function fair_recent(vtc_key, tenant)
  local now = fair_now_ms()
  local _, cur, prev = fair_periods(vtc_key, tenant, now)
  return math.max(cur + prev * (1 - (now % RECENT_MS) / RECENT_MS), 0)
end

-- Keep a queued request's tenant; a tenant that was idle (its counter below the
-- floor) is lifted to the floor less its credit: what it was served of late short of
-- the least any backlogged tenant was (fair_recent), so that idleness is banked for a
-- recent period at most, and only up to what the others got in it.
local function fair_enqueue(fair_key, vtc_key, tenants_key, fairq_prefix, id, score, entry,
    ttl_ms)
  local tenant = fair_parse(entry)
  if not tenant then return end
  redis.call('HSET', fair_key, id, entry)
  redis.call('ZADD', fairq_prefix .. tenant, score, id)
  local floor = tonumber(redis.call('HGET', vtc_key, '_floor') or '0')
  local own = fair_counter(vtc_key, tenant)
  if own < floor then
    local least
    for _, t in ipairs(redis.call('SMEMBERS', tenants_key)) do
      if t ~= tenant then
        local r = fair_recent(vtc_key, t)
        if least == nil or r < least then least = r end
      end
    end
    local credit = least and math.max(least - fair_recent(vtc_key, tenant), 0) or 0
    redis.call('HSET', vtc_key, 't:' .. tenant, tostring(math.max(own, floor - credit)))
  end
  redis.call('SADD', tenants_key, tenant)
  for _, k in ipairs({fair_key, fairq_prefix .. tenant, tenants_key, vtc_key}) do
    redis.call('PEXPIRE', k, ttl_ms)
  end
end

-- A request back in the queue (a hand-back, a yield, a drain, a reap after its worker
-- died or was fenced) goes back into its tenant's set at its score, so that it is its
-- tenant's next (it is older than the tenant's other queued requests) and is claimed at
-- its tenant's turn rather than when it reaches the head of the whole queue. Its charge
-- stays (the next claim replaces it); keys made anew get the fair hash's lifetime.
local function fair_requeue(fair_key, tenants_key, fairq_prefix, id, score)
  local tenant = fair_parse(redis.call('HGET', fair_key, id))
  if not tenant then return end
  local q = fairq_prefix .. tenant
  redis.call('ZADD', q, score, id)
  redis.call('SADD', tenants_key, tenant)
  local ttl = redis.call('PTTL', fair_key)
  if ttl > 0 then
    for _, k in ipairs({q, tenants_key}) do
      if redis.call('PTTL', k) < ttl then redis.call('PEXPIRE', k, ttl) end
    end
  end
end

-- A tenant's first `n` queued requests {id, score}, dropping ids no longer queued.
local function fair_firsts(queue_key, tenants_key, fairq_prefix, tenant, n)
  local q = fairq_prefix .. tenant
  local out = {}
  for _ = 1, 20 do
    local raw = redis.call('ZRANGE', q, 0, n - 1, 'WITHSCORES')
    if #raw == 0 then
      redis.call('SREM', tenants_key, tenant)
      return out
    end
    local stale = false
    for i = 1, #raw, 2 do
      if redis.call('ZSCORE', queue_key, raw[i]) then
        out[#out + 1] = {raw[i], raw[i + 1]}
      else
        redis.call('ZREM', q, raw[i])
        stale = true
      end
    end
    if not stale or #out >= n then return out end
    out = {}
  end
  return out
end

-- The backlogged tenants in the head's priority band `band`, each {tenant, counter,
-- first id, first score}, and the least counter among them.
local function fair_tenants(queue_key, fair_key, vtc_key, tenants_key, fairq_prefix, band)
  local found, least = {}, nil
  for _, t in ipairs(redis.call('SMEMBERS', tenants_key)) do
    local first = fair_firsts(queue_key, tenants_key, fairq_prefix, t, 1)[1]
    if first then
      local _, _, p = fair_parse(redis.call('HGET', fair_key, first[1]))
      if p == band then
        local c = fair_counter(vtc_key, t)
        found[#found + 1] = {t, c, first[1], first[2]}
        if least == nil or c < least then least = c end
      end
    end
  end
  return found, least
end

-- The requests fairness allows a claim to take, head of the queue given: up to `n`
-- requests of the tenants in the head's band whose counter is at most the least plus
-- `slack`, taken in turns, the least-served tenant first (its first request, then the
-- next tenant's first, ..., then each one's second, ...), so that every such tenant is
-- in a routed window, and where affinity prefers none the least-served tenant's request
-- comes first; slack 0 and n 1: the least-served tenant's first request (ties: the
-- earlier). Returns ids, scores, least; nil when the head has no tenant (the queue's
-- order then stands).
local function fair_window(queue_key, fair_key, vtc_key, tenants_key, fairq_prefix, head,
    head_score, slack, n)
  local head_tenant, _, band = fair_parse(redis.call('HGET', fair_key, head))
  if band == nil then return nil end
  local found, least = fair_tenants(queue_key, fair_key, vtc_key, tenants_key, fairq_prefix,
    band)
  local listed = false
  for _, f in ipairs(found) do listed = listed or f[1] == head_tenant end
  if not listed then  -- in no tenant's set (requeued by a version that did not keep it)
    local c = fair_counter(vtc_key, head_tenant)
    found[#found + 1] = {head_tenant, c, head, head_score}
    if least == nil or c < least then least = c end
  end
  local within = {}
  for _, f in ipairs(found) do
    if f[2] <= least + slack then within[#within + 1] = f end
  end
  table.sort(within, function(a, b)
    if a[2] ~= b[2] then return a[2] < b[2] end
    return tonumber(a[4]) < tonumber(b[4])
  end)
  local queued = {}
  for t, f in ipairs(within) do
    queued[t] = {{f[3], f[4]}}
    if n > 1 then
      for _, r in ipairs(fair_firsts(queue_key, tenants_key, fairq_prefix, f[1], n)) do
        if r[1] ~= f[3] then queued[t][#queued[t] + 1] = r end
      end
    end
  end
  local ids, scores, seen = {}, {}, {}
  for turn = 1, n do
    for t = 1, #queued do
      local r = queued[t][turn]
      if r and not seen[r[1]] and #ids < n then
        ids[#ids + 1], scores[#scores + 1] = r[1], r[2]
        seen[r[1]] = true
      end
    end
    if #ids >= n then break end
  end
  return ids, scores, least
end

local CHARGED = 'charged:'

-- Charge a claimed request's tenant its weighted cost (in place of what an earlier
-- claim of it charged); the floor becomes `least`.
local function fair_charge(fair_key, vtc_key, fairq_prefix, id, cost, least)
  local t, w = fair_parse(redis.call('HGET', fair_key, id))
  if not t then return end
  redis.call('ZREM', fairq_prefix .. t, id)
  local earlier = tonumber(redis.call('HGET', fair_key, CHARGED .. id) or '0')
  local c = fair_counter(vtc_key, t)
  redis.call('HSET', vtc_key, 't:' .. t, tostring(c + (tonumber(cost) - earlier) / w),
    '_floor', tostring(least or c))
  fair_recent_add(vtc_key, t, (tonumber(cost) - earlier) / w)
  redis.call('HSET', fair_key, CHARGED .. id, cost)
end

-- A request handed straight to a parked worker (nothing waited that it could take):
-- kept and charged as a claimed one (its tenant lifted to the floor first, as at
-- enqueue), so that fair share counts what runs and settles it at the release.
local function fair_handed(fair_key, vtc_key, id, entry, cost, ttl_ms)
  local t, w = fair_parse(entry)
  if not t then return end
  local c = math.max(fair_counter(vtc_key, t),
    tonumber(redis.call('HGET', vtc_key, '_floor') or '0'))
  redis.call('HSET', vtc_key, 't:' .. t, tostring(c + tonumber(cost) / w))
  fair_recent_add(vtc_key, t, tonumber(cost) / w)
  redis.call('HSET', fair_key, id, entry, CHARGED .. id, cost)
  redis.call('PEXPIRE', fair_key, ttl_ms)
  redis.call('PEXPIRE', vtc_key, ttl_ms)
end

-- A request's run ended for good, having used `used` tokens (prompt + completion; -1:
-- not known): its tenant's counter keeps what it used instead of what it reserved.
-- Its entries go.
local function fair_settle(fair_key, vtc_key, id, used)
  local charged = redis.call('HGET', fair_key, CHARGED .. id)
  local t, w = fair_parse(redis.call('HGET', fair_key, id))
  if charged and t and used >= 0 then
    local c = fair_counter(vtc_key, t) + (used - tonumber(charged)) / w
    redis.call('HSET', vtc_key, 't:' .. t, tostring(c))
    fair_recent_add(vtc_key, t, (used - tonumber(charged)) / w)
    -- The floor stays at or below every counter: a tenant lifted to it later is not
    -- put past one whose charge came back.
    if c < tonumber(redis.call('HGET', vtc_key, '_floor') or '0') then
      redis.call('HSET', vtc_key, '_floor', tostring(c))
    end
  end
  redis.call('HDEL', fair_key, id, CHARGED .. id)
end
