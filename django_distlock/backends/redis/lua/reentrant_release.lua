-- Reentrant release: drop one nesting level of the lease if it is still
-- ARGV[1]'s; when the last level goes, release it and hand it straight to
-- the first live waiter in the queue, as the plain release script does.
--
-- KEYS[1] lease hash  KEYS[2] waiter queue  KEYS[3] waiter records
-- ARGV[1] token  ARGV[2] prefix of the waiters' wake lists (same hash slot)
-- ARGV[3] owner, or '' to release every level at once (force release)
--
-- Returns 0: not held by ARGV[1] (expired, taken over or cleared): nothing done.
--         1: released, nobody waiting.
--         2: released and handed to the next waiter.
--         3: one level released; the owner still holds the lease.
-- The wake list of a reentrant waiter receives "+<fence>" (its o and c are
-- set here); a plain waiter's receives "<fence>".
local lease = redis.call('hmget', KEYS[1], 't', 'o', 'c')
if lease[1] ~= ARGV[1] then
  return 0
end
if ARGV[3] ~= '' and lease[2] == ARGV[3] .. ' ' .. ARGV[1]
    and (tonumber(lease[3]) or 1) > 1 then
  redis.call('hincrby', KEYS[1], 'c', -1)
  return 3
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
      local message = fence
      if r[6] then
        redis.call('hset', KEYS[1], 'o', r[6] .. ' ' .. waiter, 'c', 1)
        message = '+' .. fence
      else
        redis.call('hdel', KEYS[1], 'o', 'c')
      end
      redis.call('pexpire', KEYS[1], r[2])
      local wake = ARGV[2] .. waiter
      redis.call('rpush', wake, message)
      redis.call('pexpire', wake, r[1] - now_ms + 1000)
      return 2
    end
  end
end
redis.call('del', KEYS[1])
return 1
