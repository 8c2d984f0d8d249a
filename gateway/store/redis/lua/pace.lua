-- The pacing window alone (pacing.lua is prepended). KEYS: window zset, tightening hash.
-- ARGV: rate, guard, unique member, least wait.
return pace(KEYS[1], KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]))
