-- Routing helpers (llmq.protocol.routing), prepended to the scripts that route: claim.lua
-- (which queued request a worker takes) and enqueue.lua (which parked worker is handed
-- an arriving one). A route hint is "priority|session|b1,b2,..."
-- (llmq.protocol.codec.RouteHint); a worker's load "running|capacity|service ms|block
-- us" (llmq.protocol.codec.load), read as {running, capacity, service_ms, block_us}.
-- A route is a table of what the calling script was given: policy (an entry of
-- POLICIES, below, by the policy's name), cache_prefix, session_prefix, loads_key,
-- beats_key, now (lease time), live_ms, max_workers, imbalance (-1: adaptive).

-- A hint as a table {priority, session, blocks}; nil if absent or malformed.
local function parse_hint(value)
  if not value then
    return nil
  end
  local priority, session, names = string.match(value, '^(-?%d+)|([^|]*)|(.*)$')
  if not priority then
    return nil
  end
  local blocks = {}
  for name in string.gmatch(names, '[^,]+') do
    blocks[#blocks + 1] = name
  end
  return {priority = tonumber(priority), session = session, blocks = blocks}
end

-- How many of `blocks` (a prompt's chained block names) from the first on the set
-- holds. Holding block k means having computed every block before it, so this is a
-- binary search: at most 1 + log2(#blocks) SISMEMBER calls.
local function held_blocks(set_key, blocks)
  local n = #blocks
  if n == 0 or redis.call('SISMEMBER', set_key, blocks[1]) == 0 then
    return 0
  end
  local lo, hi = 1, n
  while lo < hi do
    local mid = math.floor((lo + hi + 1) / 2)
    if redis.call('SISMEMBER', set_key, blocks[mid]) == 1 then
      lo = mid
    else
      hi = mid - 1
    end
  end
  return lo
end

-- A load as a table {running, capacity, service_ms, block_us}: zeros for what a
-- worker has not published.
local function parse_load(value)
  local load = {0, 0, 0, 0}
  local i = 1
  for field in string.gmatch(value or '', '[^|]+') do
    if i > 4 then break end
    load[i] = tonumber(field) or 0
    i = i + 1
  end
  return load
end

local function load_text(load)
  return table.concat(load, '|')
end

-- The workers that beat within live_ms of lease time (at most max_workers), and a
-- table of their loads (parse_load).
local function live_workers(route)
  local ids = redis.call('ZRANGEBYSCORE', route.beats_key, ms(route.now - route.live_ms), '+inf',
    'LIMIT', 0, route.max_workers)
  local loads = {}
  if #ids > 0 then
    local raw = redis.call('HMGET', route.loads_key, unpack(ids))
    for i, w in ipairs(ids) do
      loads[w] = parse_load(raw[i])
    end
  end
  return ids, loads
end

-- The worker that took the session's last request ('' if none or no session).
local function session_worker(route, hint)
  if hint.session == '' then
    return ''
  end
  return redis.call('GET', route.session_prefix .. hint.session) or ''
end

-- The routing policies by their one name (llmq.protocol.routing.POLICIES; fifo routes
-- nothing, so it has none). rank(route, w, hint, last, load): how much worker w wants
-- the request of `hint` (higher: more; equal: no preference), `last` being the
-- session's last worker and `load` w's (parse_load). gains: a claim takes, among
-- the requests it may, the one it wants most (not the first). caches: a worker that
-- takes a request holds its blocks from then on (remember). holds: a request may wait
-- for a busy worker that wants it more, unless the load guard (too_busy) says that
-- worker is too busy. saved(hint, more, less): the blocks a worker of rank `more`
-- spares the request over one of rank `less` (what the adaptive guard prices).
local POLICIES = {
  -- Its cached leading blocks, and above any cache the session's last worker.
  ['prefix'] = {
    rank = function(route, w, hint, last, load)
      local held = held_blocks(route.cache_prefix .. w, hint.blocks)
      if last == w then
        held = held + #hint.blocks + 1
      end
      return held
    end,
    -- A session's last worker counts as holding every named block.
    saved = function(hint, more, less)
      return math.min(more, #hint.blocks) - math.min(less, #hint.blocks)
    end,
    gains = true, caches = true, holds = true,
  },
  -- Fewer running (a full worker least).
  ['least-loaded'] = {
    rank = function(route, w, hint, last, load)
      if load[2] > 0 and load[1] >= load[2] then
        return -1000000
      end
      return -load[1]
    end,
    saved = function(hint, more, less) return 0 end,
    gains = false, caches = false, holds = false,
  },
  -- Rendezvous hash of the first block.
  ['hash'] = {
    rank = function(route, w, hint, last, load)
      if #hint.blocks == 0 then
        return 0
      end
      return tonumber(string.sub(redis.sha1hex(hint.blocks[1] .. '|' .. w), 1, 8), 16)
    end,
    -- The owner is presumed to hold the blocks the hint names (the first).
    saved = function(hint, more, less) return #hint.blocks end,
    gains = false, caches = false, holds = true,
  },
}

-- The route of a routed script (see the top), from its slots of the same names.
local function route_of(policy_name, cache_prefix, session_prefix, loads_key, beats_key,
    live_ms, max_workers, imbalance)
  return {policy = POLICIES[policy_name], cache_prefix = cache_prefix,
    session_prefix = session_prefix, loads_key = loads_key, beats_key = beats_key,
    live_ms = live_ms, max_workers = max_workers, imbalance = imbalance}
end

-- The load guard: whether a worker of load `load`, which would spare the request
-- `saved` blocks of prefill, is too busy for the request to wait for it rather than
-- go to a taker of load `taker` (the claiming worker; in a hand-off, a parked one).
-- Fixed (imbalance >= 0, AIBrix's): it runs more than `imbalance` requests beyond
-- the taker. Adaptive (imbalance < 0): its expected wait for a free slot is longer
-- than the taker needs to compute those blocks. The wait: `ahead` requests already
-- left for it, so it needs running + ahead + 1 - capacity slots freed, one every
-- service_ms / capacity while full; the recompute: saved x the taker's block_us.
-- Either pace not measured yet (0): it is waited for (affinity, bounded by the wait
-- and overtaking guards).
local function too_busy(route, load, taker, saved, ahead)
  if route.imbalance >= 0 then
    return load[1] - taker[1] > route.imbalance
  end
  if load[2] == 0 or load[3] == 0 or taker[4] == 0 then
    return false
  end
  local short = load[1] + ahead + 1 - load[2]  -- 0 or less: a slot is free
  return short * load[3] * 1000 / load[2] > saved * taker[4]
end

-- How much worker w wants the request of `hint`, by the route's policy.
local function rank(route, w, hint, last, load)
  return route.policy.rank(route, w, hint, last, load)
end

-- Worker w took the request of `hint`: the session remembers it, and (prefix) w's
-- published cache gains the prompt's blocks now, before its engine has computed and
-- reported them (as an approximate router records its own decisions), so that the
-- requests of the same prefix that arrive during its prefill follow it. A set this
-- creates lives `live_ms` unless the worker's beats renew it; its engine's evictions
-- and its periodic full report correct what was never cached.
local function remember(route, hint, w, ttl_ms)
  if not hint then
    return
  end
  if hint.session ~= '' then
    redis.call('SET', route.session_prefix .. hint.session, w, 'PX', ttl_ms)
  end
  local set_key = route.cache_prefix .. w
  if route.policy.caches and #hint.blocks > 0 then
    redis.call('SADD', set_key, unpack(hint.blocks))
    if redis.call('PTTL', set_key) < 0 then
      redis.call('PEXPIRE', set_key, route.live_ms)
    end
  end
end
