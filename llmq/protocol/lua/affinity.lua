-- Routing helpers (llmq.protocol.routing), prepended to the scripts that route: claim.lua
-- (which queued request a worker takes) and enqueue.lua (which parked worker is handed
-- an arriving one). A route hint is "priority|session|b1,b2,..."
-- (llmq.protocol.codec.RouteHint); a worker's load "running|capacity"
-- (llmq.protocol.codec.load). A route is a table of what the calling script was given:
-- mode ('prefix', 'load' or 'hash'), cache_prefix, session_prefix, loads_key,
-- beats_key, now (lease time), live_ms, max_workers.

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

-- The workers that beat within live_ms of lease time (at most max_workers), and a
-- table of their loads {running, capacity} ({0, 0} for a worker that published none).
local function live_workers(route)
  local ids = redis.call('ZRANGEBYSCORE', route.beats_key, ms(route.now - route.live_ms), '+inf',
    'LIMIT', 0, route.max_workers)
  local loads = {}
  if #ids > 0 then
    local raw = redis.call('HMGET', route.loads_key, unpack(ids))
    for i, w in ipairs(ids) do
      local running, capacity = string.match(raw[i] or '', '^(%d+)|(%d+)$')
      loads[w] = {tonumber(running or '0'), tonumber(capacity or '0')}
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

-- How much worker w wants the request of `hint` (higher: more; equal: no preference).
-- prefix: its cached leading blocks, and above any cache the session's last worker;
-- load: fewer running (a full worker least); hash: rendezvous hash of the first block.
local function rank(route, w, hint, last, load)
  if route.mode == 'prefix' then
    local held = held_blocks(route.cache_prefix .. w, hint.blocks)
    if last == w then
      held = held + #hint.blocks + 1
    end
    return held
  elseif route.mode == 'load' then
    if load[2] > 0 and load[1] >= load[2] then
      return -1000000
    end
    return -load[1]
  elseif route.mode == 'hash' and #hint.blocks > 0 then
    return tonumber(string.sub(redis.sha1hex(hint.blocks[1] .. '|' .. w), 1, 8), 16)
  end
  return 0
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
  if route.mode == 'prefix' and #hint.blocks > 0 then
    redis.call('SADD', set_key, unpack(hint.blocks))
    if redis.call('PTTL', set_key) < 0 then
      redis.call('PEXPIRE', set_key, route.live_ms)
    end
  end
end
