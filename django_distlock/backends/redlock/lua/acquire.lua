-- Redlock, one node: take the lease if it is free, else register as a waiter.
--
-- KEYS[1] lease (string "<token>\n<fence>\n<holder description>")
-- KEYS[2] fencing counter  KEYS[3] waiters (zset token -> expiry ms)
-- ARGV[1] token  ARGV[2] ttl ms  ARGV[3] holder description
-- ARGV[4] 0 to try once, else ms the caller's waiter entry lives
-- ARGV[5] clock floor: the caller's clock in seconds * 2^20
-- ARGV[6] ms a new fencing counter is kept
--
-- Returns {1, fence}: granted; fence = counter + 1 (or ARGV[5] for a new
--                     counter), now stored in the counter and in the lease.
--         {0, pttl}:  busy (held, or reserved for the registered waiters);
--                     pttl is the lease's remaining ms. Registered if ARGV[4] > 0.
-- The counter moves on busy attempts too: tokens may skip values, never repeat.
-- Numbers stay exact below 2^53 (seconds * 2^20 reaches it in the year 2242).
local fence = redis.call('incr', KEYS[2])
if fence < 1048576 then
  -- Below 2^20 the counter is new (first use, lost data, retention over):
  -- it starts from the clock floor and is kept ARGV[6] ms from now.
  fence = math.max(fence, tonumber(ARGV[5]))
  redis.call('set', KEYS[2], string.format('%d', fence), 'px', ARGV[6])
end
local value = ARGV[1] .. '\n' .. string.format('%d', fence) .. '\n' .. ARGV[3]
if redis.call('set', KEYS[1], value, 'nx', 'px', ARGV[2]) then
  if ARGV[4] ~= '0' then
    redis.call('zrem', KEYS[3], ARGV[1])
  end
  return {1, fence}
end
local current = redis.call('get', KEYS[1])
local mine = ARGV[1] .. '\n'
if string.sub(current, 1, #mine) == mine then
  -- Already ours (an earlier attempt whose undo did not reach this node):
  -- the lease restarts now, as the caller's validity assumes.
  -- (A first attempt's lease carries no fencing token: it gets this one.)
  redis.call('set', KEYS[1], value, 'px', ARGV[2])
  return {1, fence}
end
if current == '' and redis.call('zscore', KEYS[3], ARGV[1]) then
  -- A release reserved the lock for the waiters it found; we are one.
  redis.call('set', KEYS[1], value, 'px', ARGV[2])
  redis.call('zrem', KEYS[3], ARGV[1])
  return {1, fence}
end
local live = tonumber(ARGV[4])
if live > 0 then
  local now = redis.call('time')
  local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
  redis.call('zadd', KEYS[3], now_ms + live, ARGV[1])
  if redis.call('pttl', KEYS[3]) < live then
    redis.call('pexpire', KEYS[3], live)
  end
end
return {0, redis.call('pttl', KEYS[1])}
