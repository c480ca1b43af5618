-- Several enqueues as one atomic step, all or none. KEYS and ARGV are those of each
-- call of enqueue.lua in turn (run here as enqueue_one), after a header in ARGV: n
-- (calls), max_depth, then per call its key count and argument count. KEYS[1] is
-- the model's queue. The batch is refused (0) unless the queue has room for all n;
-- otherwise each call runs enqueue.lua itself. Returns 0, or 1 when all were admitted.
local queue_key = KEYS[1]
local n = tonumber(ARGV[1])
local max_depth = tonumber(ARGV[2])

if live_depth(queue_key) + n > max_depth then
  return 0
end
local k, a = 0, 2 + 2 * n
for i = 1, n do
  local nkeys, nargs = tonumber(ARGV[1 + 2 * i]), tonumber(ARGV[2 + 2 * i])
  local ks, as = {}, {}
  for j = 1, nkeys do ks[j] = KEYS[k + j] end
  for j = 1, nargs do as[j] = ARGV[a + j] end
  k, a = k + nkeys, a + nargs
  if enqueue_one(ks, as) == 0 then
    return redis.error_reply('ENQUEUE refused a request of an admitted batch')
  end
end
return 1
