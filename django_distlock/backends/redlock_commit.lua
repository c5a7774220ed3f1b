-- Redlock, one node: make a fencing token chosen across nodes visible here.
--
-- KEYS[1] lease hash  KEYS[2] fencing counter
-- ARGV[1] token  ARGV[2] fencing token  ARGV[3] ms the fencing counter is kept
--
-- The counter is raised to ARGV[2] whether or not the lease is ours (it only
-- ever grows, so that is harmless and helps the nodes agree).
-- Returns 1: the lease is ARGV[1]'s and now carries the fencing token.
--         0: the lease is not ARGV[1]'s here.
local stored = tonumber(redis.call('get', KEYS[2]) or '0')
if tonumber(ARGV[2]) > stored then
  redis.call('set', KEYS[2], ARGV[2], 'px', ARGV[3])
end
if redis.call('hget', KEYS[1], 't') ~= ARGV[1] then
  return 0
end
redis.call('hset', KEYS[1], 'f', ARGV[2])
return 1
