-- Take a tenant's quota for the requests of one client request, all or none:
-- one request each from the request bucket, their tokens (prompt + max_tokens) from
-- the token bucket, and a place each among the tenant's requests at once. Each bucket
-- refills at limit/60000 a ms and holds at most a tenth of a minute's limit (BURST; at
-- least one): a limit is an average, not a minute's worth at once. Requests need a whole
-- request each in their bucket; tokens are taken while the token bucket is above zero,
-- and may take it below (a debt the refill repays before the next), so a request larger
-- than the burst still passes, alone. A limit of 0 is none. A request's place at once
-- is held until it is returned (quota_return.lua) or its hold lapses (queue timeout +
-- generation timeout: what a crashed API process or worker leaks at most); lapsed
-- places are dropped here. A take whose requests all hold their reservation already is
-- taken without taking anything again (idempotent: llmq.protocol.queue.Queue.admit
-- pipelines it, and a pipeline may run twice).
-- Reply: {ok, limit_requests, remaining_requests, reset_requests_ms,
--         limit_tokens, remaining_tokens, reset_tokens_ms, retry_ms, which}
-- (which: '' when taken, else 'requests', 'tokens' or 'concurrent');
-- llmq.protocol.quota.parse_take. KEYS and ARGV: llmq.protocol.slots.QuotaTake.
local tpm_key = KEYS[1]
local rpm_key = KEYS[2]
local inflight_key = KEYS[3]
local reserved_key = KEYS[4]

local tpm = tonumber(ARGV[1])
local rpm = tonumber(ARGV[2])
local max_concurrent = tonumber(ARGV[3])
local hold_ms = tonumber(ARGV[4])
local count = tonumber(ARGV[5])
-- then count pairs: request id, tokens

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local BURST = 0.1

local function capacity(limit)
  return math.max(limit * BURST, 1)
end

-- A bucket's level now (refilled since it was last written), never above its capacity.
local function level(key, limit)
  if limit <= 0 then return 0 end
  local saved = redis.call('HMGET', key, 'level', 'ms')
  local lvl, at = tonumber(saved[1]), tonumber(saved[2])
  if lvl == nil or at == nil then return capacity(limit) end
  return math.min(capacity(limit), lvl + math.max(now - at, 0) * limit / 60000)
end

local function save(key, limit, lvl)
  redis.call('HSET', key, 'level', tostring(lvl), 'ms', ms(now), 'limit', limit,
    'cap', tostring(capacity(limit)))
  redis.call('PEXPIRE', key, 120000)
end

-- ms until a bucket at `lvl` holds `want` (0 if it does).
local function wait_for(limit, lvl, want)
  if limit <= 0 or lvl >= want then return 0 end
  return math.ceil((want - lvl) * 60000 / limit)
end

local tokens = 0
for i = 1, count do tokens = tokens + tonumber(ARGV[5 + 2 * i]) end
local req_level, tok_level = level(rpm_key, rpm), level(tpm_key, tpm)

-- Taken already (a pipeline run again after Redis lost a script: the same take twice):
-- taken, and nothing taken again.
local held = 0
for i = 1, count do held = held + redis.call('HEXISTS', reserved_key, ARGV[4 + 2 * i]) end

local which, retry = '', 0
if count > 0 and held == count then
  count, tokens = 0, 0
elseif rpm > 0 and req_level < count then
  which, retry = 'requests', wait_for(rpm, req_level, count)
elseif tpm > 0 and tok_level <= 0 then
  which, retry = 'tokens', wait_for(tpm, tok_level, 0) + 1
elseif max_concurrent > 0 then
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', inflight_key, '-inf', now)) do
    redis.call('ZREM', inflight_key, id)
    redis.call('HDEL', reserved_key, id)
  end
  if redis.call('ZCARD', inflight_key) + count > max_concurrent then
    which, retry = 'concurrent', 1000
  end
end

if which == '' then
  if rpm > 0 then
    req_level = req_level - count
    save(rpm_key, rpm, req_level)
  end
  if tpm > 0 then
    tok_level = tok_level - tokens
    save(tpm_key, tpm, tok_level)
  end
  for i = 1, count do
    local id = ARGV[4 + 2 * i]
    redis.call('ZADD', inflight_key, ms(now + hold_ms), id)
    redis.call('HSET', reserved_key, id, ARGV[5 + 2 * i])
  end
  redis.call('PEXPIRE', inflight_key, hold_ms)
  redis.call('PEXPIRE', reserved_key, hold_ms)
end

return {which == '' and 1 or 0,
  rpm, math.floor(math.max(req_level, 0)), wait_for(rpm, req_level, capacity(rpm)),
  tpm, math.floor(math.max(tok_level, 0)), wait_for(tpm, tok_level, capacity(tpm)),
  retry, which}
