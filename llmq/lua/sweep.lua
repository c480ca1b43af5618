-- Remove queued requests whose deadline passed (deadlines are the clients' real
-- time, not lease time); returns their ids.
local deadlines_key = KEYS[1]

local now_ms = ARGV[1]
local limit = ARGV[2]
local queue_prefix = ARGV[3]
local costs_prefix = ARGV[4]
local job_prefix = ARGV[5]

local due = redis.call('ZRANGEBYSCORE', deadlines_key, '-inf', now_ms, 'LIMIT', 0, limit)
local out = {}
for _, member in ipairs(due) do
  redis.call('ZREM', deadlines_key, member)
  local sep = string.find(member, ':', 1, true)
  if sep then
    local id = string.sub(member, 1, sep - 1)
    local model = string.sub(member, sep + 1)
    if redis.call('ZREM', queue_prefix .. model, id) == 1 then
      redis.call('HDEL', costs_prefix .. model, id)
      redis.call('DEL', job_prefix .. id)
      table.insert(out, id)
    end
  end
end
return out
