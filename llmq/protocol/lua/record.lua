-- A new request's record and its 'queued' lifecycle note, in the request's slot,
-- written before the model-slot enqueue.lua admits it (llmq.protocol.queue.Queue.admit
-- argues the order). Returns the note's entry id, which a refused request's caller
-- deletes again with the record.
local record_key = KEYS[1]
local lifecycle_key = KEYS[2]

local ttl_ms = ARGV[1]
local lifecycle_maxlen = ARGV[2]
local id = ARGV[3]
local model = ARGV[4]
local lifecycle_data = ARGV[5]
local record_from = 6

redis.call('HSET', record_key, unpack(ARGV, record_from))
redis.call('PEXPIRE', record_key, ttl_ms)
return redis.call('XADD', lifecycle_key, 'MAXLEN', '~', lifecycle_maxlen, '*', 'event', 'queued',
  'request_id', id, 'model', model, 'data', lifecycle_data)
