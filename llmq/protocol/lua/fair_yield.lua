-- A full worker asks whether one of its running requests should give its slot to a
-- request of another tenant (LLMQ_FAIRNESS=vtc). The request fair share would claim
-- next (lua/fair.lua's pick in the head's band) is of tenant W; a candidate of tenant
-- R, in the same band, gives way when R holds more of the pool's running requests, by
-- weight, than W would after the swap:
--   (running[R] - 1) / weight[R] >= (running[W] + 1) / weight[W]
-- Slot-level max-min fairness on top of the counters' order: a lone tenant keeps every
-- slot (work-conserving), two backlogged tenants of equal weight settle at half the
-- pool each, and a tenant that arrives at a full pool starts within a token instead of
-- waiting for a run to end. One waiting request frees one slot: a worker that gives
-- way holds yield_prefix..its id (SET NX, PX yield_ms), which the others see.
-- Returns the candidate to hand back, or false.
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

local head = redis.call('ZRANGE', queue_key, 0, 0, 'WITHSCORES')
if #head == 0 then return false end
local ids = fair_window(queue_key, fair_key, vtc_key, tenants_key, fairq_prefix, head[1],
  head[2], 0, 1)
if not ids or #ids == 0 then return false end
local waiting = ids[1]
local w_tenant, w_weight, w_band = fair_parse(redis.call('HGET', fair_key, waiting))
if not w_tenant or redis.call('EXISTS', yield_prefix .. waiting) == 1 then return false end
local running = {}
for _, id in ipairs(redis.call('HKEYS', leases_key)) do
  local t = fair_parse(redis.call('HGET', fair_key, id))
  if t then running[t] = (running[t] or 0) + 1 end
end
local after = ((running[w_tenant] or 0) + 1) / w_weight
for i = 5, #ARGV do
  local t, w, p = fair_parse(redis.call('HGET', fair_key, ARGV[i]))
  if t and t ~= w_tenant and p == w_band and ((running[t] or 0) - 1) / w >= after then
    redis.call('SET', yield_prefix .. waiting, worker_id, 'PX', yield_ms)
    return ARGV[i]
  end
end
return false
