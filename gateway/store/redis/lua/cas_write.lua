-- The record write alone (cas.lua is prepended).
return cas(KEYS, ARGV)
