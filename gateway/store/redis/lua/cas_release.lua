-- The record write, then the poll lease (KEYS[8], token ARGV[7]) released when the write
-- went through: a poll's answer recorded and its lease given back in one round trip.
local written = cas(KEYS, ARGV)
if written == 1 and redis.call('GET', KEYS[8]) == ARGV[7] then redis.call('DEL', KEYS[8]) end
return written
