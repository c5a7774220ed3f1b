-- Release one shared lease of a lock. When the last shared holder goes, hand
-- the lock to the head of the queue: the first live exclusive waiter gets
-- the lease (as the plain release script hands it), or the shared waiters
-- at the head (left there by a writer that died) get shared leases.
--
-- KEYS[1] lease hash  KEYS[2] waiter queue  KEYS[3] waiter records
-- KEYS[4] shared holders ZSET  KEYS[5] shared holders' metadata
-- ARGV[1] token  ARGV[2] prefix of the wake lists
--
-- Returns 0: ARGV[1] holds no shared lease (expired or cleared): nothing done.
--         1: released.
--         2: released, and the lock handed to waiters.
local lease = redis.call('hmget', KEYS[1], 't', 'f')
if lease[1] ~= MARK then
  return 0
end
if not holds(KEYS[4], KEYS[5], ARGV[1]) then
  return 0
end
if not redis.call('lindex', KEYS[2], 0) and live_count(KEYS[4]) == 1 then
  -- The last holder, nobody waiting (expired holders go with the keys).
  redis.call('del', KEYS[1], KEYS[4], KEYS[5])
  return 1
end
redis.call('zrem', KEYS[4], ARGV[1])
redis.call('hdel', KEYS[5], ARGV[1])
purge(KEYS[4], KEYS[5])
if redis.call('zcard', KEYS[4]) > 0 then
  expire_with(KEYS[4], {KEYS[1], KEYS[4], KEYS[5]})
  return 1
end
local fence = lease[2]
local shared = 0
while true do
  local w = redis.call('lindex', KEYS[2], 0)
  if not w then
    break
  end
  local r = live_record(KEYS[3], w)
  if r and string.sub(w, 1, 1) ~= '~' then
    if shared > 0 then
      break
    end
    redis.call('lpop', KEYS[2])
    redis.call('hdel', KEYS[3], w)
    redis.call('del', KEYS[4], KEYS[5])
    redis.call('hset', KEYS[1], 't', w, 'f', now_us(), 'h', r[3], 'p', r[4],
               'th', r[5], 'a', tostring(now_ms))
    redis.call('pexpire', KEYS[1], r[2])
    wake(ARGV[2], w, r, now_us())
    return 2
  end
  redis.call('lpop', KEYS[2])
  if r then
    redis.call('hdel', KEYS[3], w)
    redis.call('zadd', KEYS[4], now_ms + r[2], w)
    redis.call('hset', KEYS[5], w, cmsgpack.pack({r[3], r[4], r[5], now_ms}))
    wake(ARGV[2], w, r, 's' .. fence)
    shared = shared + 1
  end
end
if shared > 0 then
  expire_with(KEYS[4], {KEYS[1], KEYS[4], KEYS[5]})
  return 2
end
redis.call('del', KEYS[1], KEYS[4], KEYS[5])
return 1
