-- acquire.lua as it was before the pipelined wait (main at d72e0f5), kept to
-- test a rolling upgrade: processes of both versions on the same names.
--
-- Take the lock if it is free; otherwise queue the caller as a waiter.
--
-- KEYS[1] lease hash   KEYS[2] waiter queue (list of tokens)
-- KEYS[3] waiter records (hash token -> msgpack {deadline_ms, ttl_ms, host, pid, thread})
-- ARGV[1] token  ARGV[2] ttl ms  ARGV[3] name  ARGV[4] host  ARGV[5] pid
-- ARGV[6] thread  ARGV[7] 0 to try once, else ms the caller's waiter record lives
-- ARGV[8] 1 if this token may be queued already (a retry), else 0
--
-- Returns {1, fence}: acquired (also when the lease is already this token's,
--                     so a retried call is harmless).
--         {0, pttl}:  busy; pttl is the lease's remaining ms. Queued if ARGV[7] > 0.
-- The fencing token is the server clock in microseconds: it keeps increasing
-- when the lease (and everything else) is gone, even after a restart that
-- lost the data, as long as the server clock does not step back.
local holder = redis.call('hget', KEYS[1], 't')
if holder == ARGV[1] then
  return {1, redis.call('hget', KEYS[1], 'f')}
end
local now = redis.call('time')
if not holder then
  local fence = now[1] .. string.format('%06d', now[2])
  -- 'a', the time acquired in ms, is the fence without its last three digits.
  redis.call('hset', KEYS[1], 't', ARGV[1], 'f', fence, 'n', ARGV[3], 'h', ARGV[4],
             'p', ARGV[5], 'th', ARGV[6], 'a', string.sub(fence, 1, -4))
  redis.call('pexpire', KEYS[1], ARGV[2])
  -- A fresh token has no place in the queue: only a retry looks for one.
  if ARGV[8] == '1' and redis.call('hdel', KEYS[3], ARGV[1]) == 1 then
    redis.call('lrem', KEYS[2], 1, ARGV[1])
  end
  return {1, fence}
end
local live = tonumber(ARGV[7])
if live > 0 then
  local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
  local record = cmsgpack.pack({now_ms + live, tonumber(ARGV[2]), ARGV[4], ARGV[5], ARGV[6]})
  if redis.call('hset', KEYS[3], ARGV[1], record) == 1 then
    redis.call('rpush', KEYS[2], ARGV[1])
  end
  if redis.call('pttl', KEYS[2]) < live then
    redis.call('pexpire', KEYS[2], live)
    redis.call('pexpire', KEYS[3], live)
  end
end
return {0, redis.call('pttl', KEYS[1])}
