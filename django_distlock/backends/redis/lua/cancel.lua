-- A waiter gives up: take it out of the queue. If the lock was handed to it
-- in the meantime, it keeps it (the caller then counts as having acquired).
--
-- KEYS[1] lease hash  KEYS[2] waiter queue  KEYS[3] waiter records
-- KEYS[4] the waiter's wake list  ARGV[1] token
-- Returns {1, fence}: the waiter holds the lock.  {0, 0}: it does not.
if redis.call('hdel', KEYS[3], ARGV[1]) == 1 then
  redis.call('lrem', KEYS[2], 1, ARGV[1])
end
redis.call('del', KEYS[4])
if redis.call('hget', KEYS[1], 't') == ARGV[1] then
  return {1, redis.call('hget', KEYS[1], 'f')}
end
return {0, 0}
