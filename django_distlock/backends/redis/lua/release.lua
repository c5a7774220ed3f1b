-- Release the lease if it is still ARGV[1]'s, handing it straight to the
-- first live waiter in the queue (no waiter has to poll or race for it).
--
-- KEYS[1] lease hash  KEYS[2] waiter queue  KEYS[3] waiter records
-- ARGV[1] token  ARGV[2] prefix of the waiters' wake lists (same hash slot)
--
-- Returns 0: not held by ARGV[1] (expired, taken over or cleared): nothing done.
--         1: released, nobody waiting.
--         2: released and handed to the next waiter.
if redis.call('hget', KEYS[1], 't') ~= ARGV[1] then
  return 0
end
-- The clock is read only for a waiter: an uncontended release does not need it.
local now, now_ms
while true do
  local waiter = redis.call('lpop', KEYS[2])
  if not waiter then
    break
  end
  local packed = redis.call('hget', KEYS[3], waiter)
  if packed then
    if not now then
      now = redis.call('time')
      now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
    end
    redis.call('hdel', KEYS[3], waiter)
    local r = cmsgpack.unpack(packed)
    if r[1] > now_ms then
      local fence = now[1] .. string.format('%06d', now[2])
      redis.call('hset', KEYS[1], 't', waiter, 'f', fence, 'h', r[3], 'p', r[4],
                 'th', r[5], 'a', tostring(now_ms))
      redis.call('pexpire', KEYS[1], r[2])
      local wake = ARGV[2] .. waiter
      redis.call('rpush', wake, fence)
      redis.call('pexpire', wake, r[1] - now_ms + 1000)
      return 2
    end
  end
end
redis.call('del', KEYS[1])
return 1
