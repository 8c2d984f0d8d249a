-- An idempotency key: the first writer wins. KEYS: the key. ARGV: entry JSON, expiry (ms).
local seen = redis.call('GET', KEYS[1])
if seen then return seen end
redis.call('SET', KEYS[1], ARGV[1], 'PXAT', ARGV[2])
return false
