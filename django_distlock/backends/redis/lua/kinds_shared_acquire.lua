-- Take a shared lease of a lock, or queue the caller behind the exclusive
-- holder or the first live exclusive waiter (writer preference).
--
-- KEYS[1] lease hash (the plain backend's: while shared holders hold the
-- lock its 't' is MARK, so the exclusive scripts see it busy)
-- KEYS[2] waiter queue  KEYS[3] waiter records  KEYS[4] shared holders ZSET
-- KEYS[5] shared holders' metadata (token -> msgpack {host, pid, thread, acquired ms})
-- ARGV[1] token (starts with '~': the queue tells shared waiters by it)
-- ARGV[2] ttl ms  ARGV[3] name  ARGV[4] host  ARGV[5] pid  ARGV[6] thread
-- ARGV[7] 0 to try once, else ms the caller's waiter record lives
-- ARGV[8] prefix of the wake lists  ARGV[9] '1': the caller gives up waiting
-- (leave the queue first; a lease already given to it is kept)
-- ARGV[10] (the semaphore's limit: unused)  ARGV[11] '1' if the caller may
-- hold or wait already (not its first call): only then is that looked for
--
-- Returns {1, fence}: held (also when already granted to ARGV[1]: a retry
--                     is harmless). The fence is the lock's current one.
--         {0, pttl}:  busy; queued if ARGV[7] > 0.
-- Shared waiters woken here receive "s<fence>": they hold the lease. An
-- exclusive release hands the lease to a shared waiter like to any waiter
-- (its wake list receives "<fence>"); the waiter then calls this script,
-- which turns that lease into a shared one.
local token = ARGV[1]
local ttl = tonumber(ARGV[2])
local live = tonumber(ARGV[7])
local again = ARGV[11] == '1'
if ARGV[9] == '1' then
  leave(KEYS[2], KEYS[3], ARGV[8], token)
end
local lease = redis.call('hmget', KEYS[1], 't', 'f')
local holder = lease[1]
local fence = lease[2]
-- The holders' keys expire with the lease hash, and only a MARK in it
-- leaves holders alive.
if holder == MARK then
  purge(KEYS[4], KEYS[5])
end
-- Whether this call opened the lock to shared holders, and the latest
-- expiry of a holder it granted.
local opened = false
local latest = 0

local function grant(w, r)
  local expires = now_ms + r[2]
  if expires > latest then
    latest = expires
  end
  redis.call('zadd', KEYS[4], expires, w)
  redis.call('hset', KEYS[5], w, cmsgpack.pack({r[3], r[4], r[5], now_ms}))
end

local function open()
  if holder ~= MARK then
    -- Free, or handed to this caller by an exclusive release.
    if holder or fence then
      redis.call('del', KEYS[1])
    end
    fence = fence or now_us()
    redis.call('hset', KEYS[1], 't', MARK, 'f', fence, 'n', ARGV[3])
    holder = MARK
    opened = true
  end
end

local me = {0, ttl, ARGV[4], ARGV[5], ARGV[6]}
local have = false
if holder == token then
  open()
  grant(token, me)
  have = true
elseif holder == MARK then
  if again and redis.call('zscore', KEYS[4], token) then
    return {1, fence}
  end
  if redis.call('zcard', KEYS[4]) == 0 then
    redis.call('del', KEYS[1])
    holder = nil
    fence = nil
  end
end
if holder and holder ~= MARK then
  if live > 0 then
    enqueue(KEYS[2], KEYS[3], token, live, ttl, ARGV[4], ARGV[5], ARGV[6])
  end
  return {0, redis.call('pttl', KEYS[1])}
end

-- Free or shared: serve the shared waiters at the head of the queue, up to
-- the first live exclusive waiter.
local mine = have
local granted = {}
local writer = nil
while true do
  local w = redis.call('lindex', KEYS[2], 0)
  if not w then
    break
  end
  local r = live_record(KEYS[3], w)
  if r and w ~= token and string.sub(w, 1, 1) ~= '~' then
    writer = {w, r}
    break
  end
  redis.call('lpop', KEYS[2])
  if r then
    redis.call('hdel', KEYS[3], w)
    if w == token then
      mine = true
    else
      granted[#granted + 1] = {w, r}
    end
  end
end
if not writer then
  mine = true
end
if not holder and writer and not mine and #granted == 0 then
  -- The lock is free and an exclusive waiter comes first: hand it the lease
  -- (its holders expired; nobody released it).
  local w, r = writer[1], writer[2]
  redis.call('lpop', KEYS[2])
  redis.call('hdel', KEYS[3], w)
  redis.call('hset', KEYS[1], 't', w, 'f', now_us(), 'n', ARGV[3], 'h', r[3],
             'p', r[4], 'th', r[5], 'a', tostring(now_ms))
  redis.call('pexpire', KEYS[1], r[2])
  wake(ARGV[8], w, r, now_us())
  if live > 0 then
    enqueue(KEYS[2], KEYS[3], token, live, ttl, ARGV[4], ARGV[5], ARGV[6])
  end
  return {0, r[2]}
end
if mine or #granted > 0 then
  open()
end
for _, g in ipairs(granted) do
  grant(g[1], g[2])
  wake(ARGV[8], g[1], g[2], 's' .. fence)
end
if mine and not have then
  grant(token, me)
end
if holder == MARK then
  if opened then
    -- Every holder was granted here: the latest of them is the last.
    expire_at({KEYS[1], KEYS[4], KEYS[5]}, latest)
  else
    expire_with(KEYS[4], {KEYS[1], KEYS[4], KEYS[5]})
  end
end
if mine then
  return {1, fence}
end
if live > 0 then
  enqueue(KEYS[2], KEYS[3], token, live, ttl, ARGV[4], ARGV[5], ARGV[6])
end
return {0, redis.call('pttl', KEYS[1])}
