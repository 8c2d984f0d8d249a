-- A tightening kept past an instant ends then (a provider-wide pause is bounded by policy,
-- also one stored before it was). KEYS: the tightening hash. ARGV: the latest end.
local untl = tonumber(redis.call('HGET', KEYS[1], 'until'))
local latest = tonumber(ARGV[1])
if not untl or untl <= latest then return 0 end
redis.call('HSET', KEYS[1], 'until', ARGV[1])
redis.call('PEXPIREAT', KEYS[1], math.ceil(latest * 1000) + 1000)
return 1
