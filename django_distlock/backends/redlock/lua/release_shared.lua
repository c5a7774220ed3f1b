-- Redlock, one node: remove the shared lease ARGV[1]; if it was the last
-- reader, free the lock, and if waiters are registered, reserve the lock for
-- them briefly and wake one of them (as release.lua does).
--
-- KEYS[1] lease  KEYS[2] readers (zset)  KEYS[3] readers' descriptions (hash)
-- KEYS[4] waiters (zset)  KEYS[5] wake list
-- ARGV[1] token
--
-- Returns 1: released (it was live here).
--         0: not a live shared lease here (expired, cleared): nothing
--            of anyone else's was touched.
local expires = redis.call('zscore', KEYS[2], ARGV[1])
if not expires then
  return 0
end
redis.call('zrem', KEYS[2], ARGV[1])
redis.call('hdel', KEYS[3], ARGV[1])
local current = redis.call('get', KEYS[1])
if not current or string.sub(current, 1, 2) ~= '*\n' then
  return 0
end
local now = redis.call('time')
local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
local held = 0
if tonumber(expires) > now_ms then
  held = 1
end
redis.call('zremrangebyscore', KEYS[2], '-inf', now_ms)
local last = redis.call('zrange', KEYS[2], -1, -1, 'WITHSCORES')
if #last > 0 then
  -- Other readers remain: the marker lives as long as the longest of them.
  redis.call('pexpire', KEYS[1], tonumber(last[2]) - now_ms)
  return held
end
redis.call('del', KEYS[1], KEYS[2], KEYS[3])
if redis.call('exists', KEYS[4]) == 0 then
  return held
end
redis.call('zremrangebyscore', KEYS[4], '-inf', now_ms)
if redis.call('zcard', KEYS[4]) == 0 then
  return held
end
redis.call('set', KEYS[1], '', 'px', 50)
redis.call('del', KEYS[5])
redis.call('rpush', KEYS[5], '1')
redis.call('pexpire', KEYS[5], 2000)
return held
