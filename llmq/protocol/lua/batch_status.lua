-- Move a batch to `status` (stamping `<status>_at`) if it is in one of the
-- statuses after ARGV[2]: the one place a batch's status changes, so a cancel and the
-- feeder's finalizing cannot both win. Returns 1 if it moved, 0 if not.
local batch_key = KEYS[1]

local status = ARGV[1]
local now = ARGV[2]

local current = redis.call('HGET', batch_key, 'status')
if not current then
  return 0
end
for i = 3, #ARGV do
  if ARGV[i] == current then
    redis.call('HSET', batch_key, 'status', status, status .. '_at', now)
    return 1
  end
end
return 0
