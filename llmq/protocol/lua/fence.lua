-- Raise a request's fence past an attempt that lost its lease (reap.lua reaped it, in
-- the model's slot; the fence is in the request's). Returns 1.
local fence_key = KEYS[1]

local lowest = tonumber(ARGV[1])
local ttl = ARGV[2]

raise_fence(fence_key, lowest, ttl)
return 1
