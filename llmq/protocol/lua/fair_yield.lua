-- A full worker asks whether one of its running requests should give its slot to a
-- request of another tenant (LLMQ_FAIRNESS=vtc). The request fair share would claim
-- next (lua/fair.lua's pick in the head's band) is of tenant W; a candidate of tenant
-- R, in the same band, gives way when, after the swap, R would still hold at least W's
-- share of the pool, counting both the running requests and the service of late:
--   ((n[R] - 1) / weight[R] - (n[W] + 1) / weight[W]) / n
--     + (recent[R] - recent[W]) / (recent[R] + recent[W])  >=  0
-- with n[t] a tenant's running requests in the pool, n all of the pool's, and recent[t]
-- the tokens it was charged in about the last RECENT_MS, divided by its weight
-- (fair_recent). Slot-level max-min fairness on top of the counters' order: a lone
-- tenant keeps every slot (work-conserving); two backlogged tenants of equal weight,
-- served alike of late, settle at half the pool each; a tenant
-- that arrives at a full pool starts within a token instead of waiting for a run to
-- end; and one served less than R of late may hold more slots than R at once (light
-- traffic in bursts starts at once), by the pool's size times the difference of their
-- shares of that service at most, which its own service soon evens out. One waiting
-- request frees one slot: a worker that gives way holds yield_prefix..its id (SET NX,
-- PX yield_ms), which the others see.
-- Returns the candidate to hand back; or, for no, '=' .. the one tenant whose requests
-- wait ('=' alone: none wait) when at most one tenant's do: then no later call says
-- otherwise for candidates of that tenant until another tenant's request is queued,
-- which the worker hears in the wake-up (lua/enqueue.lua); false for a plain no.
local queue_key = KEYS[1]
local fair_key = KEYS[2]
local vtc_key = KEYS[3]
local tenants_key = KEYS[4]
local leases_key = KEYS[5]

local fairq_prefix = ARGV[1]
local yield_prefix = ARGV[2]
local yield_ms = ARGV[3]
local worker_id = ARGV[4]
-- ARGV[5..]: the worker's candidates, the one to give way first first.

local function no()
  local tenants = redis.call('SMEMBERS', tenants_key)
  if #tenants > 1 then return false end
  return '=' .. (tenants[1] or '')
end

local head = redis.call('ZRANGE', queue_key, 0, 0, 'WITHSCORES')
if #head == 0 then return '=' end
local ids = fair_window(queue_key, fair_key, vtc_key, tenants_key, fairq_prefix, head[1],
  head[2], 0, 1)
if not ids or #ids == 0 then return no() end
local waiting = ids[1]
local w_tenant, w_weight, w_band = fair_parse(redis.call('HGET', fair_key, waiting))
if not w_tenant then return false end
if redis.call('EXISTS', yield_prefix .. waiting) == 1 then return false end
local running, pool = {}, 0
for _, id in ipairs(redis.call('HKEYS', leases_key)) do
  local t = fair_parse(redis.call('HGET', fair_key, id))
  if t then running[t] = (running[t] or 0) + 1 end
  pool = pool + 1
end
local after = ((running[w_tenant] or 0) + 1) / w_weight
local w_recent = fair_recent(vtc_key, w_tenant)
for i = 5, #ARGV do
  local t, w, p = fair_parse(redis.call('HGET', fair_key, ARGV[i]))
  local share = 0
  if t and t ~= w_tenant and p == w_band then
    local r_recent = fair_recent(vtc_key, t)
    share = (((running[t] or 0) - 1) / w - after) / math.max(pool, 1)
    if r_recent + w_recent > 0 then
      share = share + (r_recent - w_recent) / (r_recent + w_recent)
    end
  end
  if t and t ~= w_tenant and p == w_band and share >= 0 then
    redis.call('SET', yield_prefix .. waiting, worker_id, 'PX', yield_ms)
    return ARGV[i]
  end
end
return no()
