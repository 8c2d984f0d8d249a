-- The record write: a compare-and-set on the version that, when the write spends a status
-- request, also re-checks outcome, deadline, budget and next_poll_at against Redis TIME,
-- and keeps the provider's index keys in step.
-- KEYS: the record, the provider's active set, deadlines and ended sorted sets, its
-- open-escalations hash, its escalation queue (by escalation time) and its completion
-- outbox (owed events by ended_at, sent ones at +inf; NX: one entry an operation). ARGV: expected version, record JSON, clock tolerance, operation
-- id, deadline_at, ended_at ('' when none).
-- cas(k, a) takes those KEYS and ARGV as tables k and a; it returns 1 written, 0 stale version, -1 no record, -2 refused by Redis time.
local function cas(k, a)
  local stored = redis.call('HGET', k[1], 'v')
  if not stored then return -1 end
  if tonumber(stored) ~= tonumber(a[1]) then return 0 end
  local new = cjson.decode(a[2])
  local old = cjson.decode(redis.call('HGET', k[1], 'd'))
  if new.status_requests_used > old.status_requests_used then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
    if old.outcome ~= 'pending' or now >= old.deadline_at
       or old.status_requests_used >= old.max_status_requests
       or now < old.next_poll_at - tonumber(a[3])
       or new.status_requests_used ~= old.status_requests_used + 1 then
      return -2
    end
  end
  redis.call('HSET', k[1], 'v', tonumber(a[1]) + 1, 'd', a[2], 'o', new.outcome)
  if new.outcome == 'pending' then
    redis.call('SADD', k[2], a[4])
    redis.call('ZADD', k[3], a[5], a[4])
    redis.call('ZREM', k[4], a[4])
  else
    redis.call('SREM', k[2], a[4])
    redis.call('ZREM', k[3], a[4])
    if a[6] == '' then
      redis.call('ZREM', k[4], a[4])
    else
      redis.call('ZADD', k[4], a[6], a[4])
    end
  end
  if new.outcome == 'escalated' and type(new.escalation) == 'table' then
    redis.call('HSET', k[5], a[4], new.escalation.reason)
    redis.call('ZADD', k[6], new.escalation.at, a[4])
  else
    redis.call('HDEL', k[5], a[4])
    redis.call('ZREM', k[6], a[4])
  end
  if new.announce == true and (new.outcome == 'succeeded' or new.outcome == 'failed'
      or new.outcome == 'cancelled' or new.outcome == 'expired') then
    redis.call('ZADD', k[7], 'NX', tonumber(a[6]) or 0, a[4])
  end
  return 1
end
