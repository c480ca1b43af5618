-- Undo record.lua for a request the model's queue refused: its record and its
-- 'queued' note go, and the group's lifecycle stream too if that note was all it
-- held, so that a refused request leaves no key behind.
local record_key = KEYS[1]
local lifecycle_key = KEYS[2]

local note_id = ARGV[1]

redis.call('DEL', record_key)
redis.call('XDEL', lifecycle_key, note_id)
if redis.call('XLEN', lifecycle_key) == 0 then
  redis.call('DEL', lifecycle_key)
end
return 1
