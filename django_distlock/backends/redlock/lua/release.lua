-- Redlock, one node: delete the lease if it is still ARGV[1]'s; if waiters
-- are registered, reserve the lock for them briefly and wake one of them.
--
-- KEYS[1] lease (string "<token>\n<fence>\n...")  KEYS[2] waiters (zset)
-- KEYS[3] wake list
-- ARGV[1] token
-- The two durations are written here rather than passed, as they never
-- change and every argument costs the node work on each call: the
-- reservation lasts 50 ms, a wake signal nobody took stays 2000 ms.
--
-- Returns 0: not held by ARGV[1] (expired, taken over or cleared): nothing done.
--         1: released, nobody waiting.
--         2: released, reserved for the waiters and one of them woken.
local current = redis.call('get', KEYS[1])
local mine = ARGV[1] .. '\n'
if not current or string.sub(current, 1, #mine) ~= mine then
  return 0
end
redis.call('del', KEYS[1])
if redis.call('exists', KEYS[2]) == 0 then
  return 1
end
local now = redis.call('time')
local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
redis.call('zremrangebyscore', KEYS[2], '-inf', now_ms)
if redis.call('zcard', KEYS[2]) == 0 then
  return 1
end
-- The reservation (an empty lease) lets only registered waiters in, so a
-- releaser that loops cannot starve them.
redis.call('set', KEYS[1], '', 'px', 50)
-- One signal: one waiter wakes, not a herd. A waiter that blocks after this
-- finds the signal still there.
redis.call('del', KEYS[3])
redis.call('rpush', KEYS[3], '1')
redis.call('pexpire', KEYS[3], 2000)
return 2
