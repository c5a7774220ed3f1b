-- Extend (or only check) one holder of a shared lock or a semaphore.
--
-- KEYS[1] holders ZSET  KEYS[2] owner hash (lock lease hash or semaphore
-- hash)  KEYS[3] holders' metadata hash
-- ARGV[1] token  ARGV[2] ttl ms, or '0' to only check
-- ARGV[3] MARK: the owner hash's 't' must be it (shared locks); '' for permits
-- Returns 1: held (and extended to ARGV[2] ms from now).  0: not held.
if ARGV[3] ~= '' and redis.call('hget', KEYS[2], 't') ~= ARGV[3] then
  return 0
end
local score = redis.call('zscore', KEYS[1], ARGV[1])
if not score or tonumber(score) <= now_ms then
  return 0
end
if ARGV[2] == '0' then
  return 1
end
redis.call('zadd', KEYS[1], now_ms + tonumber(ARGV[2]), ARGV[1])
expire_with(KEYS[1], {KEYS[1], KEYS[2], KEYS[3]})
return 1
