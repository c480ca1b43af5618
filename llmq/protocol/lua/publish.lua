-- Every write a worker makes for a request, fenced and idempotent: stream events,
-- record fields and lifecycle notes; one call carries the writes of many requests
-- (a worker's whole flush), each written by publish_one as if it were alone. KEYS
-- are, per request, its stream, record, fence and lifecycle keys; ARGV is, per
-- request, its argument count, then its arguments (llmq.protocol.slots.Publish,
-- read in place: nothing is copied per request). Returns one reply per request, in
-- order: 1 when written (or already written), 0 when the writer's attempt is fenced
-- off: a later attempt owns the request (reap.lua, requeue.lua), and nothing of
-- its writes lands; or the error its writes raised. A fenced or failing request
-- changes nothing for the others. On a Redis Cluster the caller sends one call per
-- slot (llmq.protocol.streams.publish_calls).
--
-- The fence key (llmq.protocol.keys.fence) holds `attempt`, the lowest attempt allowed to
-- write (a write from a higher one raises it), `next`, the stream's next token index
-- (tokens are contiguous from 0 below it) and `ended` ('1' once a terminal event is
-- in, absent before). A tokens event below `next` is skipped and a partial overlap
-- trimmed, so a flush retried after a lost reply never duplicates an index. A
-- terminal event's usage, and the record's completion_tokens, are what the stream
-- holds (`next`), not what the producer meant. Attempt 0 writes unfenced (a job too
-- malformed to run).

-- The request whose keys follow KEYS[k] and whose arguments follow ARGV[a]
-- (ARGV[a + 1] is the first, its attempt); `last` is the index of its last argument.
local function publish_one(k, a, last)
  local stream_key = KEYS[k + 1]
  local record_key = KEYS[k + 2]
  local fence_key = KEYS[k + 3]
  local lifecycle_key = KEYS[k + 4]

  local attempt = tonumber(ARGV[a + 1])
  local ttl = ARGV[a + 2]
  local maxlen = ARGV[a + 3]
  local lifecycle_maxlen = ARGV[a + 4]
  local n_events = tonumber(ARGV[a + 5])
  local n_record = tonumber(ARGV[a + 6])
  local n_notes = tonumber(ARGV[a + 7])  -- they run to `last`
  local events_from = a + 8
  local record_from = events_from + 4 * n_events
  local notes_from = record_from + 2 * n_record
  local state = redis.call('HMGET', fence_key, 'attempt', 'next', 'ended')
  local fence = tonumber(state[1] or '0')
  if attempt > 0 and attempt < fence then
    return 0
  end
  if state[3] == '1' then
    return 1
  end
  local next_index = tonumber(state[2] or '0')
  local ended = false
  -- TTLs are set when the fence is new and with every non-token event (the first
  -- event of a run is 'started'), not on every token flush: HSET and XADD keep them.
  local needs_ttl = not state[2]

  local function add(kind, data)
    redis.call('XADD', stream_key, 'MAXLEN', '~', maxlen, '*', 'type', kind, 'data', data)
  end

  for i = events_from, record_from - 1, 4 do
    local kind, data = ARGV[i], ARGV[i + 1]
    if kind == 'tokens' then
      local index, count = tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
      if index + count > next_index then
        if index < next_index then
          local event = cjson.decode(data)
          local rest = {}
          for k = next_index - index + 1, #event.tokens do
            table.insert(rest, event.tokens[k])
          end
          event.tokens, event.index = rest, next_index
          if type(event.logprobs) == 'table' then
            local kept = {}
            for k = next_index - index + 1, #event.logprobs do
              table.insert(kept, event.logprobs[k])
            end
            event.logprobs = kept
          end
          data = cjson.encode(event)
        end
        add(kind, data)
        if index <= next_index then
          next_index = index + count
        end
      end
    elseif kind == 'done' or kind == 'error' then
      local event = cjson.decode(data)
      if type(event.usage) == 'table' then
        event.usage.completion_tokens = next_index
        event.usage.total_tokens = (tonumber(event.usage.prompt_tokens) or 0) + next_index
        data = cjson.encode(event)
      end
      add(kind, data)
      ended = true
      needs_ttl = true
      break
    else
      add(kind, data)
      needs_ttl = true
    end
  end
  if needs_ttl then
    redis.call('EXPIRE', stream_key, ttl)
  end

  if n_record > 0 then
    local fields = {}
    for i = record_from, notes_from - 1, 2 do
      local value = ARGV[i + 1]
      if ARGV[i] == 'completion_tokens' then
        value = tostring(next_index)
      end
      table.insert(fields, ARGV[i])
      table.insert(fields, value)
    end
    redis.call('HSET', record_key, unpack(fields))
    redis.call('EXPIRE', record_key, ttl)
  end

  for i = notes_from, last, 4 do
    redis.call('XADD', lifecycle_key, 'MAXLEN', '~', lifecycle_maxlen, '*', 'event', ARGV[i],
      'request_id', ARGV[i + 1], 'model', ARGV[i + 2], 'data', ARGV[i + 3])
  end

  -- The fence is written only when it changes: a call that adds no token to a
  -- running request (a note, a record update) leaves it as it was.
  if next_index ~= tonumber(state[2]) or ended or attempt > fence then
    if ended then
      redis.call('HSET', fence_key, 'next', next_index, 'ended', '1')
    else
      redis.call('HSET', fence_key, 'next', next_index)
    end
    if attempt > fence then
      redis.call('HSET', fence_key, 'attempt', attempt)
    end
  end
  if needs_ttl then
    redis.call('EXPIRE', fence_key, ttl)
  end
  return 1

end

local replies = {}
local k, a = 0, 0
while k < #KEYS do
  local count_at = a + 1  -- then the request's own arguments
  local nargs = tonumber(ARGV[count_at])
  local ok, reply = pcall(publish_one, k, count_at, count_at + nargs)
  if ok then
    replies[#replies + 1] = reply
  elseif type(reply) == 'table' and reply.err then
    replies[#replies + 1] = reply
  else
    replies[#replies + 1] = {err = 'ERR publish: ' .. tostring(reply)}
  end
  k, a = k + 4, a + 1 + nargs
end
return replies
