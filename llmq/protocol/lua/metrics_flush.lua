-- One process's metric deltas (llmq.metrics.Tally.flush), applied at once with the
-- marker that says they were: a flush whose reply was lost is sent again only if its
-- marker is missing, so a delta is never counted twice. Every key is in the metrics
-- slot, so this is one call on a Redis Cluster as on a single Redis.
-- KEYS: the marker, the per-second window, the per-minute window (per tenant), then
-- one hash per metric family.
-- ARGV: the marker's, the second window's and the minute window's TTL (s), how many
-- (field, value) pairs the second window gets, those pairs, how many the minute window
-- gets, those pairs, then per family hash: its pair count and its pairs.
local marker_key = KEYS[1]
local window_key = KEYS[2]
local minute_key = KEYS[3]

local marker_ttl = ARGV[1]
local window_ttl = ARGV[2]
local minute_ttl = ARGV[3]
local n_window = tonumber(ARGV[4])

local at = 5
for _ = 1, n_window do
  redis.call('HINCRBYFLOAT', window_key, ARGV[at], ARGV[at + 1])
  at = at + 2
end
if n_window > 0 then
  redis.call('EXPIRE', window_key, window_ttl)
end
local n_minute = tonumber(ARGV[at])
at = at + 1
for _ = 1, n_minute do
  redis.call('HINCRBYFLOAT', minute_key, ARGV[at], ARGV[at + 1])
  at = at + 2
end
if n_minute > 0 then
  redis.call('EXPIRE', minute_key, minute_ttl)
end
for k = 4, #KEYS do
  local n = tonumber(ARGV[at])
  at = at + 1
  for _ = 1, n do
    redis.call('HINCRBYFLOAT', KEYS[k], ARGV[at], ARGV[at + 1])
    at = at + 2
  end
end
redis.call('SET', marker_key, '1', 'EX', marker_ttl)
return 1
