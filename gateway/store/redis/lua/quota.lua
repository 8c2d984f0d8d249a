-- A submission counted against a holder's quotas (keys.quota_wait, the same rule).
-- KEYS: the active places zset (operation id -> claimed at), the submits zset (operation id
-- -> forwarded at), one hash tag. ARGV: operation id, now, max active (0: none), submits
-- per hour (0: none), the hour, the wait when the active places are taken, then places
-- found free (their operations ended) to give back first. Returns the wait as a string
-- ('0': counted).
local id, now = ARGV[1], tonumber(ARGV[2])
local maxa, perh = tonumber(ARGV[3]), tonumber(ARGV[4])
local hour, retry = tonumber(ARGV[5]), tonumber(ARGV[6])
for i = 7, #ARGV do redis.call('ZREM', KEYS[1], ARGV[i]) end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - hour)
local wait = 0
if maxa > 0 and redis.call('ZCARD', KEYS[1]) >= maxa then wait = retry end
if perh > 0 then
  local n = redis.call('ZCARD', KEYS[2])
  if n >= perh then
    local oldest = redis.call('ZRANGE', KEYS[2], n - perh, n - perh, 'WITHSCORES')
    wait = math.max(wait, tonumber(oldest[2]) + hour - now)
  end
end
if wait == 0 then
  if maxa > 0 then redis.call('ZADD', KEYS[1], now, id) end
  if perh > 0 then
    redis.call('ZADD', KEYS[2], now, id)
    redis.call('PEXPIRE', KEYS[2], math.ceil(hour * 1000) + 60000)
  end
end
return tostring(wait)
