-- Reentrant acquire: take the lock if it is free, re-enter it if the caller's
-- owner already holds it, otherwise queue the caller as a waiter.
--
-- KEYS[1] lease hash   KEYS[2] waiter queue (list of tokens)
-- KEYS[3] waiter records (hash token -> msgpack
--         {deadline_ms, ttl_ms, host, pid, thread, owner})
-- ARGV[1] token  ARGV[2] ttl ms  ARGV[3] name  ARGV[4] host  ARGV[5] pid
-- ARGV[6] thread  ARGV[7] 0 to try once, else ms the caller's waiter record
-- lives  ARGV[8] owner (process id + thread or task)
--
-- The lease hash has the fields of the plain backend (t f n h p th a) plus
-- o = "<owner> <token>" and c = nesting count. Binding the owner to the
-- token means a lease handed on by a plain (non-reentrant) script, which
-- leaves o behind, can never be re-entered by the old owner.
--
-- Returns {1, fence, token, pttl}: acquired afresh, or already handed to
--                                  ARGV[1] (a retry after a handoff).
--         {2, fence, token, pttl}: re-entered: the owner held it under
--                                  `token`; c incremented; the expiry is
--                                  pushed out to at least ARGV[2] ms.
--         {0, pttl}:               busy. Queued if ARGV[7] > 0.
local ttl = tonumber(ARGV[2])
local lease = redis.call('hmget', KEYS[1], 't', 'f', 'o')
local holder = lease[1]
if holder == ARGV[1] then
  local mine = ARGV[8] .. ' ' .. holder
  if lease[3] ~= mine then
    -- Handed over by a plain release script: adopt it.
    redis.call('hset', KEYS[1], 'o', mine, 'c', 1)
  end
  return {1, lease[2], holder, redis.call('pttl', KEYS[1])}
end
if holder and lease[3] == ARGV[8] .. ' ' .. holder then
  redis.call('hincrby', KEYS[1], 'c', 1)
  local pttl = redis.call('pttl', KEYS[1])
  if pttl < ttl then
    redis.call('pexpire', KEYS[1], ttl)
    pttl = ttl
  end
  return {2, lease[2], holder, pttl}
end
local now = redis.call('time')
if not holder then
  local fence = now[1] .. string.format('%06d', now[2])
  redis.call('hset', KEYS[1], 't', ARGV[1], 'f', fence, 'n', ARGV[3], 'h', ARGV[4],
             'p', ARGV[5], 'th', ARGV[6],
             'a', string.sub(fence, 1, -4),  -- the time acquired, in ms
             'o', ARGV[8] .. ' ' .. ARGV[1], 'c', 1)
  redis.call('pexpire', KEYS[1], ttl)
  if ARGV[7] ~= '0' and redis.call('hdel', KEYS[3], ARGV[1]) == 1 then
    redis.call('lrem', KEYS[2], 1, ARGV[1])
  end
  return {1, fence, ARGV[1], ttl}
end
local live = tonumber(ARGV[7])
if live > 0 then
  local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
  local record = cmsgpack.pack({now_ms + live, ttl, ARGV[4], ARGV[5], ARGV[6],
                                ARGV[8]})
  if redis.call('hset', KEYS[3], ARGV[1], record) == 1 then
    redis.call('rpush', KEYS[2], ARGV[1])
  end
  if redis.call('pttl', KEYS[2]) < live then
    redis.call('pexpire', KEYS[2], live)
    redis.call('pexpire', KEYS[3], live)
  end
end
return {0, redis.call('pttl', KEYS[1])}
