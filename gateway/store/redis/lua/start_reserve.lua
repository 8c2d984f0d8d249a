-- A poll's first round trip: the lease (KEYS[1], token ARGV[1], PX ARGV[2]), a place in the
-- pacing window (KEYS[2], KEYS[3], ARGV[3..6] as pace.lua), then the reservation written by
-- cas.lua (KEYS[4..10], ARGV[7..12]). Returns {wait, written}: wait '-1' when another holds
-- the lease, more than '0' when pacing asks to wait (nothing written, the lease kept);
-- written is cas()'s answer when it ran (1 written, 0 stale, -1 gone, -2 refused by time);
-- when stale, the stored record's JSON comes third, to reserve from without another read.
-- (pacing.lua and cas.lua are prepended.)
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return {'-1', 0} end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local wait = pace(KEYS[2], KEYS[3], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6]))
if wait ~= '0' then return {wait, 0} end
local k = {KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]}
local a = {ARGV[7], ARGV[8], ARGV[9], ARGV[10], ARGV[11], ARGV[12]}
local written = cas(k, a)
if written == 0 then return {'0', 0, redis.call('HGET', KEYS[4], 'd')} end
return {'0', written}
