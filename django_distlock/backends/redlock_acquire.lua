-- Redlock, one node: take the lease if it is free, else register as a waiter.
--
-- KEYS[1] lease hash  KEYS[2] fencing counter  KEYS[3] waiters (zset token -> expiry ms)
-- ARGV[1] token  ARGV[2] ttl ms  ARGV[3] holder metadata (name, host, pid, ...)
-- ARGV[4] 0 to try once, else ms the caller's waiter entry lives
-- ARGV[5] ms the fencing counter is kept
--
-- Returns {1, fence}: granted. fence = max(counter + 1, server seconds * 2^20)
--                     is stored in the counter and in the lease.
--         {0, pttl}:  busy (held, or reserved for the registered waiters);
--                     pttl is the lease's remaining ms. Registered if ARGV[4] > 0.
-- Numbers go back to Redis as Lua numbers: exact below 2^53 (year 2242).
local h = redis.call('hmget', KEYS[1], 't', 'r')
if h[1] == ARGV[1] then
  return {1, tonumber(redis.call('hget', KEYS[1], 'f'))}
end
local now = redis.call('time')
local free = not h[1]
if free and h[2] then
  -- A release reserved the lock for the waiters it found: only they may take it.
  free = redis.call('zscore', KEYS[3], ARGV[1]) ~= false
end
if not free then
  local live = tonumber(ARGV[4])
  if live > 0 then
    local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
    redis.call('zadd', KEYS[3], now_ms + live, ARGV[1])
    if redis.call('pttl', KEYS[3]) < live then
      redis.call('pexpire', KEYS[3], live)
    end
  end
  return {0, redis.call('pttl', KEYS[1])}
end
local fence = (tonumber(redis.call('get', KEYS[2])) or 0) + 1
local base = now[1] * 1048576
if base > fence then
  fence = base
end
redis.call('set', KEYS[2], fence, 'px', ARGV[5])
if h[2] then
  redis.call('del', KEYS[1])
end
redis.call('hset', KEYS[1], 't', ARGV[1], 'f', fence, 'm', ARGV[3])
redis.call('pexpire', KEYS[1], ARGV[2])
if ARGV[4] ~= '0' then
  redis.call('zrem', KEYS[3], ARGV[1])
end
return {1, fence}
