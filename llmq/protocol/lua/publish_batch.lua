-- The writes of many runs in one call: publish.lua once per request (run here as
-- publish_one), so that a worker's flush costs Redis one script call, not one per
-- stream. KEYS are those of each request in turn, four each (stream, record, fence,
-- lifecycle); ARGV is, per request, its argument count, then publish.lua's
-- arguments (llmq.protocol.codec.publish_args). Returns one reply per request, in
-- order: 1 written, 0 fenced off, or the error its call raised. Each request is
-- its own call: a fenced or failing one changes nothing for the others. On a
-- Redis Cluster the caller sends one call per slot (llmq.protocol.streams).
local replies = {}
local a = 0
for k = 0, #KEYS - 1, 4 do
  local nargs = tonumber(ARGV[a + 1])
  local args = {}
  for j = 1, nargs do args[j] = ARGV[a + 1 + j] end
  a = a + 1 + nargs
  local ok, reply = pcall(publish_one, {KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4]}, args)
  if ok then
    replies[#replies + 1] = reply
  elseif type(reply) == 'table' and reply.err then
    replies[#replies + 1] = reply
  else
    replies[#replies + 1] = {err = 'ERR publish: ' .. tostring(reply)}
  end
end
return replies
