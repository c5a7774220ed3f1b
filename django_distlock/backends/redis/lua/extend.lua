-- Make the lease expire ARGV[2] ms from now if it is still ARGV[1]'s.
--
-- KEYS[1] lease hash  ARGV[1] token  ARGV[2] ttl ms
-- Returns 1: extended.  0: not held by ARGV[1] (nothing done).
if redis.call('hget', KEYS[1], 't') ~= ARGV[1] then
  return 0
end
redis.call('pexpire', KEYS[1], ARGV[2])
return 1
