-- Record one line's result, exactly once: the first result of a custom_id goes to
-- the output (ok = '1') or the errors (ok = '0') and counts in the batch's
-- request_counts; a later one (a re-collected line after a feeder's restart, a
-- re-run) changes nothing. The line leaves the running set either way. A batch that
-- ended takes no result: its files are made and its results deleted (a late collector
-- would otherwise bring them back, with no TTL).
-- Returns 1 if this call recorded the result, 0 if the line had one already or the
-- batch ended.
local batch_key = KEYS[1]
local running_key = KEYS[2]
local output_key = KEYS[3]
local errors_key = KEYS[4]

local custom_id = ARGV[1]
local line = ARGV[2]
local ok = ARGV[3] == '1'

local status = redis.call('HGET', batch_key, 'status')
if status == 'completed' or status == 'expired' or status == 'cancelled'
    or status == 'failed' then
  return 0
end
redis.call('HDEL', running_key, custom_id)
if redis.call('HEXISTS', output_key, custom_id) == 1
    or redis.call('HEXISTS', errors_key, custom_id) == 1 then
  return 0
end
if ok then
  redis.call('HSET', output_key, custom_id, line)
  redis.call('HINCRBY', batch_key, 'completed', 1)
else
  redis.call('HSET', errors_key, custom_id, line)
  redis.call('HINCRBY', batch_key, 'failed', 1)
end
return 1
