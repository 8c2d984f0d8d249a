-- The provider asked to slow down: rate (0 pauses) until an instant, on Redis time.
-- KEYS: the tightening hash. ARGV: rate, until.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local current = redis.call('HMGET', KEYS[1], 'rate', 'until')
local rate, untl = tonumber(ARGV[1]), tonumber(ARGV[2])
if current[2] and tonumber(current[2]) > untl and tonumber(current[1]) <= rate then return 0 end
redis.call('HSET', KEYS[1], 'rate', rate, 'until', untl)
redis.call('PEXPIREAT', KEYS[1], math.ceil(untl * 1000) + 1000)
return 1
