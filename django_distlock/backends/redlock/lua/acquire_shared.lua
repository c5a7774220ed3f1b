-- Redlock, one node: take a shared lease if no exclusive lease lives here and
-- no exclusive waiter is registered (writer preference); else register as a
-- waiter.
--
-- KEYS[1] lease  KEYS[2] fencing counter  KEYS[3] waiters (zset token -> expiry ms)
-- KEYS[4] readers (zset token -> expiry ms)  KEYS[5] readers' descriptions (hash)
-- KEYS[6] wake list
-- ARGV[1] token (a shared one: it starts with "r.")  ARGV[2] ttl ms
-- ARGV[3] holder description  ARGV[4] 0 to try once, else ms the caller's
-- waiter entry lives
--
-- While a lock is held shared, its lease key holds the marker "*\n" (no
-- token starts so) and lives as long as its longest reader: an exclusive
-- SET NX finds it busy, and it vanishes by itself when every reader expired.
-- Returns {1, counter}: granted; counter is the fencing counter as it is
--                       (not incremented; 0 if there is none).
--         {0, ms}:      busy (an exclusive lease, a reservation for other
--                       waiters, or a registered exclusive waiter); ms is how
--                       long until that may change. Registered if ARGV[4] > 0.
local now = redis.call('time')
local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
local current = redis.call('get', KEYS[1])
local ok
if not current then
  ok = true
elseif current == '' then
  -- A release reserved the lock for the waiters it found.
  ok = redis.call('zscore', KEYS[3], ARGV[1]) ~= false
else
  ok = string.sub(current, 1, 2) == '*\n'
end
local writer_ms = nil
if redis.call('exists', KEYS[3]) == 1 then
  redis.call('zremrangebyscore', KEYS[3], '-inf', now_ms)
  local waiting = redis.call('zrange', KEYS[3], 0, -1, 'WITHSCORES')
  for i = 1, #waiting, 2 do
    if string.sub(waiting[i], 1, 2) ~= 'r.' then
      ok = false
      local left = tonumber(waiting[i + 1]) - now_ms
      if not writer_ms or left < writer_ms then
        writer_ms = left
      end
    end
  end
end
if ok then
  redis.call('zremrangebyscore', KEYS[4], '-inf', now_ms)
  redis.call('zadd', KEYS[4], now_ms + tonumber(ARGV[2]), ARGV[1])
  redis.call('hset', KEYS[5], ARGV[1], ARGV[3])
  local last = redis.call('zrange', KEYS[4], -1, -1, 'WITHSCORES')
  local live = tonumber(last[2]) - now_ms
  redis.call('set', KEYS[1], '*\n', 'px', live)
  redis.call('pexpire', KEYS[4], live)
  redis.call('pexpire', KEYS[5], live)
  if ARGV[4] ~= '0' and redis.call('zrem', KEYS[3], ARGV[1]) == 1
      and redis.call('zcard', KEYS[3]) > 0 then
    -- Let the next registered reader in too (no writer is registered).
    redis.call('del', KEYS[6])
    redis.call('rpush', KEYS[6], '1')
    redis.call('pexpire', KEYS[6], 2000)
  end
  return {1, tonumber(redis.call('get', KEYS[2])) or 0}
end
local live = tonumber(ARGV[4])
if live > 0 then
  redis.call('zadd', KEYS[3], now_ms + live, ARGV[1])
  if redis.call('pttl', KEYS[3]) < live then
    redis.call('pexpire', KEYS[3], live)
  end
end
local pttl = redis.call('pttl', KEYS[1])
if pttl < 0 then
  pttl = writer_ms or 0
end
return {0, pttl}
