-- A worker's routing beat (llmq.protocol.routing): what its KV cache gained and lost
-- since the last beat, and its load and pace (llmq.protocol.codec.load: "running|
-- capacity|service ms|block us"), for routed claims and hand-offs (claim.lua,
-- enqueue.lua). The cache is a set of block names per worker and model with a TTL
-- renewed here, so a dead worker's entry goes with its registry entry; the load is
-- an entry of the model's loads hash, whose entries of workers that stopped beating
-- are pruned here. Cost: one SADD/SREM argument per block that changed.
-- Reply: 1 applied; 0 the set is gone (expired, or Redis lost it) while the worker's
-- cache is not empty: nothing applied, the worker sends its whole cache (`full`).
local cache_key = KEYS[1]
local loads_key = KEYS[2]
local beats_key = KEYS[3]

local worker_id = ARGV[1]
local load = ARGV[2]
local ttl_ms = ARGV[3]
local full = ARGV[4] == '1'
local cache_size = tonumber(ARGV[5])
local n_stored = tonumber(ARGV[6])
local names_from = 7

local CHUNK = 1000

redis.call('HSET', loads_key, worker_id, load)
redis.call('PEXPIRE', loads_key, ttl_ms)
if redis.call('HLEN', loads_key) > redis.call('ZCARD', beats_key) + 16 then
  for _, w in ipairs(redis.call('HKEYS', loads_key)) do
    if not redis.call('ZSCORE', beats_key, w) then
      redis.call('HDEL', loads_key, w)
    end
  end
end

if full then
  redis.call('DEL', cache_key)
elseif cache_size > 0 and redis.call('EXISTS', cache_key) == 0 then
  return 0
end

local function apply(command, from, to)
  for i = from, to, CHUNK do
    redis.call(command, cache_key, unpack(ARGV, i, math.min(i + CHUNK - 1, to)))
  end
end

apply('SADD', names_from, names_from + n_stored - 1)
apply('SREM', names_from + n_stored, #ARGV)
redis.call('PEXPIRE', cache_key, ttl_ms)
return 1
