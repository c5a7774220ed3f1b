-- Redlock, one node: make the shared lease ARGV[1] expire ARGV[2] ms from
-- now if it is still live here.
--
-- KEYS[1] lease  KEYS[2] readers (zset)  KEYS[3] readers' descriptions (hash)
-- ARGV[1] token  ARGV[2] ttl ms
-- Returns 1: extended.  0: not a live shared lease here (nothing done).
local expires = redis.call('zscore', KEYS[2], ARGV[1])
if not expires then
  return 0
end
local now = redis.call('time')
local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
local current = redis.call('get', KEYS[1])
if tonumber(expires) <= now_ms or not current
    or string.sub(current, 1, 2) ~= '*\n' then
  return 0
end
redis.call('zadd', KEYS[2], now_ms + tonumber(ARGV[2]), ARGV[1])
-- The marker lives as long as the longest reader (this one may have
-- shortened its own lease).
local last = redis.call('zrange', KEYS[2], -1, -1, 'WITHSCORES')
local live = tonumber(last[2]) - now_ms
redis.call('pexpire', KEYS[1], live)
redis.call('pexpire', KEYS[2], live)
redis.call('pexpire', KEYS[3], live)
return 1
