-- A request of a tenant ended: give back its place at once and the tokens it reserved
-- but did not use (reserved - used, at most up to the bucket's capacity, saved in the
-- bucket by quota_take.lua). Only the first
-- return of a request counts (its reservation is deleted here), so a worker and a
-- sweep may both return it. Reply: the tokens given back.
local tpm_key = KEYS[1]
local rpm_key = KEYS[2]
local inflight_key = KEYS[3]
local reserved_key = KEYS[4]

local id = ARGV[1]
local used = tonumber(ARGV[2])

redis.call('ZREM', inflight_key, id)
local reserved = tonumber(redis.call('HGET', reserved_key, id) or '')
if reserved == nil then
  return 0
end
redis.call('HDEL', reserved_key, id)
local back = math.max(reserved - used, 0)
local saved = redis.call('HMGET', tpm_key, 'level', 'ms', 'limit', 'cap')
local lvl, at, tpm, cap = tonumber(saved[1]), tonumber(saved[2]), tonumber(saved[3]),
  tonumber(saved[4])
if back == 0 or lvl == nil or at == nil or tpm == nil or cap == nil then
  return 0  -- no token limit, or a full bucket (or one lost with Redis)
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
lvl = math.min(cap, lvl + math.max(now - at, 0) * tpm / 60000 + back)
redis.call('HSET', tpm_key, 'level', tostring(lvl), 'ms', ms(now))
redis.call('PEXPIRE', tpm_key, 120000)
return back
