-- The poll lease (KEYS[1], token ARGV[1], PX ARGV[2]), then the pacing window (KEYS[2],
-- KEYS[3], ARGV[3..6] as pace.lua): '-1' when another holds the lease, else the pacing
-- answer, the lease kept either way (pacing.lua is prepended).
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return '-1' end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return pace(KEYS[2], KEYS[3], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6]))
