-- A reentrant waiter that was handed the lease by a plain (non-reentrant)
-- release script records itself as the owner, so that it can re-enter.
--
-- KEYS[1] lease hash  ARGV[1] token  ARGV[2] owner
-- Returns 1: the lease is ARGV[1]'s (now with o and c).  0: it is not.
if redis.call('hget', KEYS[1], 't') ~= ARGV[1] then
  return 0
end
local mine = ARGV[2] .. ' ' .. ARGV[1]
if redis.call('hget', KEYS[1], 'o') ~= mine then
  redis.call('hset', KEYS[1], 'o', mine, 'c', 1)
end
return 1
