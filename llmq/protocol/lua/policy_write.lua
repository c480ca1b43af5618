-- Change the pool policy (llmq.policy.store): compare-and-set on its version, so that
-- of two changes made from the same version one is refused (and made again from the
-- new one) rather than lost. Each pair of the tail sets a field of the policy hash
-- (the pool's document, a model's), or deletes it where the value is empty; the
-- version rises by one and the change goes into the capped history stream.
-- Reply: {1, new version} or {0, the current version} (nothing changed).
-- KEYS and ARGV: llmq.protocol.slots.PolicyWrite.
local policy_key = KEYS[1]
local history_key = KEYS[2]

local expected = tonumber(ARGV[1])
local history_maxlen = ARGV[2]
local who = ARGV[3]
local what = ARGV[4]

local current = tonumber(redis.call('HGET', policy_key, 'version') or '0')
if current ~= expected then
  return {0, current}
end
for i = 5, #ARGV, 2 do
  if ARGV[i + 1] == '' then
    redis.call('HDEL', policy_key, ARGV[i])
  else
    redis.call('HSET', policy_key, ARGV[i], ARGV[i + 1])
  end
end
local version = current + 1
redis.call('HSET', policy_key, 'version', version)
redis.call('XADD', history_key, 'MAXLEN', '~', history_maxlen, '*',
  'version', version, 'who', who, 'what', what)
return {1, version}
