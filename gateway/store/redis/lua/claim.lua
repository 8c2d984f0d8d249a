-- An idempotency key: the first writer wins. KEYS: the key. ARGV: entry JSON, expiry (ms).
-- An entry equal to ARGV[1] is this same claim, sent again by the client after a broken
-- connection (the entry holds the claiming request's own token): claimed, not in use.
local seen = redis.call('GET', KEYS[1])
if seen == ARGV[1] then return false end
if seen then return seen end
redis.call('SET', KEYS[1], ARGV[1], 'PXAT', ARGV[2])
return false
