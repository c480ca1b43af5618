-- Raise a model's policy version (its claims' floor, lua/claim.lua) to a version of
-- the pool policy, never lower it. Reply: the model's version now.
-- KEYS and ARGV: llmq.protocol.slots.PolicyPublish.
local version_key = KEYS[1]

local version = tonumber(ARGV[1])

local now = tonumber(redis.call('GET', version_key) or '0')
if version > now then
  redis.call('SET', version_key, version)
  now = version
end
return now
