-- Give back one permit of a semaphore and grant the freed room to the
-- waiters at the head of the queue, first come, first served.
--
-- KEYS[1] semaphore hash  KEYS[2] waiter queue  KEYS[3] waiter records
-- KEYS[4] permits ZSET  KEYS[5] permits' metadata
-- ARGV[1] token  ARGV[2] prefix of the wake lists
--
-- Returns 0: ARGV[1] holds no permit (expired or cleared): nothing done.
--         1: released.
--         2: released, and permits granted to waiters.
if not holds(KEYS[4], KEYS[5], ARGV[1]) then
  return 0
end
if not redis.call('lindex', KEYS[2], 0) and live_count(KEYS[4]) == 1 then
  -- The last permit, nobody waiting (expired permits go with the keys).
  redis.call('del', KEYS[1], KEYS[4], KEYS[5])
  return 1
end
redis.call('zrem', KEYS[4], ARGV[1])
redis.call('hdel', KEYS[5], ARGV[1])
purge(KEYS[4], KEYS[5])
local count = redis.call('zcard', KEYS[4])
local sem = redis.call('hmget', KEYS[1], 'l', 'f')
local limit = tonumber(sem[1]) or 0
local last = tonumber(sem[2]) or 0
local handed = 0
while count < limit do
  local w = redis.call('lpop', KEYS[2])
  if not w then
    break
  end
  local r = live_record(KEYS[3], w)
  if r then
    redis.call('hdel', KEYS[3], w)
    local fence = now[1] * 1000000 + now[2]
    if fence <= last then
      fence = last + 1
    end
    last = fence
    fence = string.format('%.0f', fence)
    redis.call('zadd', KEYS[4], now_ms + r[2], w)
    redis.call('hset', KEYS[5], w, cmsgpack.pack({r[3], r[4], r[5], now_ms, fence}))
    wake(ARGV[2], w, r, fence)
    count = count + 1
    handed = handed + 1
  end
end
if count == 0 then
  redis.call('del', KEYS[1], KEYS[4], KEYS[5])
  return 1
end
redis.call('hset', KEYS[1], 'f', string.format('%.0f', last))
expire_with(KEYS[4], {KEYS[1], KEYS[4], KEYS[5]})
if handed > 0 then
  return 2
end
return 1
