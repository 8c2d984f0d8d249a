-- The record write, then the poll lease (KEYS[6], token ARGV[7]) released when the write
-- went through: a poll's answer recorded and its lease given back in one round trip.
local written = cas(KEYS, ARGV)
if written == 1 and redis.call('GET', KEYS[6]) == ARGV[7] then redis.call('DEL', KEYS[6]) end
return written
