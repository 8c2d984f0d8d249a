-- The provider's pacing window: wk the window zset, tk the tightening hash; rate (0 = no
-- ceiling), guard, a unique member, the least wait. Returns the seconds to wait as a string
-- ('0': counted, go now).
local function pace(wk, tk, rate, guard, member, minwait)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
  local tight = redis.call('HMGET', tk, 'rate', 'until')
  if tight[2] and tonumber(tight[2]) > now then
    local trate = tonumber(tight[1])
    if trate <= 0 then return tostring(tonumber(tight[2]) - now) end
    if rate <= 0 or trate < rate then rate = trate end
  end
  if rate <= 0 then return '0' end
  local limit = math.max(1, math.floor(rate))
  local window = limit / rate * guard
  redis.call('ZREMRANGEBYSCORE', wk, '-inf', now - window)
  if redis.call('ZCARD', wk) < limit then
    redis.call('ZADD', wk, now, member)
    redis.call('PEXPIRE', wk, math.ceil(window * 1000) + 1000)
    return '0'
  end
  local oldest = redis.call('ZRANGE', wk, 0, 0, 'WITHSCORES')
  return tostring(math.max(tonumber(oldest[2]) + window - now, minwait))
end
