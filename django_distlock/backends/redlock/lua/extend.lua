-- Redlock, one node: make the lease expire ARGV[2] ms from now if it is
-- still ARGV[1]'s.
--
-- KEYS[1] lease (string "<token>\n...")  ARGV[1] token  ARGV[2] ttl ms
-- Returns 1: extended.  0: not held by ARGV[1] (nothing done).
local current = redis.call('get', KEYS[1])
local mine = ARGV[1] .. '\n'
if not current or string.sub(current, 1, #mine) ~= mine then
  return 0
end
redis.call('pexpire', KEYS[1], ARGV[2])
return 1
