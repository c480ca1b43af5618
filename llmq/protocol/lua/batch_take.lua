-- Take the next lines of an in-progress batch to feed: at most `count`, from the
-- batch's `next` line on. Each taken line is marked running (without requests until
-- the feeder writes those it enqueued for it), so a feeder that dies between this and
-- its enqueue leaves the line to be fed again (see api/batch_feeder.py). Returns the
-- taken lines (JSON, each with its custom_id), none unless the batch is in_progress.
-- A running line's value: {"line": <the line>}, then with "subs" once enqueued.
local batch_key = KEYS[1]
local lines_key = KEYS[2]
local running_key = KEYS[3]

local count = tonumber(ARGV[1])

if redis.call('HGET', batch_key, 'status') ~= 'in_progress' or count <= 0 then
  return {}
end
local next_line = tonumber(redis.call('HGET', batch_key, 'next') or '0')
local taken = redis.call('LRANGE', lines_key, next_line, next_line + count - 1)
for _, line in ipairs(taken) do
  redis.call('HSET', running_key, cjson.decode(line)['custom_id'], '{"line":' .. line .. '}')
end
redis.call('HSET', batch_key, 'next', next_line + #taken)
return taken
