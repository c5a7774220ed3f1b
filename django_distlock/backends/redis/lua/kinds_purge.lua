-- Remove the expired holders of one shared lock or one semaphore (never a
-- live one), and the owner hash once no holder is left.
--
-- KEYS[1] holders ZSET  KEYS[2] owner hash  KEYS[3] holders' metadata hash
-- ARGV[1] MARK for a shared lock (its lease hash is removed only while 't'
-- is MARK), '' for a semaphore
-- Returns how many expired holders were removed.
local removed = purge(KEYS[1], KEYS[3])
if redis.call('zcard', KEYS[1]) == 0 then
  redis.call('del', KEYS[3])
  if ARGV[1] == '' or redis.call('hget', KEYS[2], 't') == ARGV[1] then
    redis.call('del', KEYS[2])
  end
end
return removed
