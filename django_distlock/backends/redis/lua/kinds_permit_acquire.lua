-- Take one permit of a semaphore, serving its waiters first come, first
-- served; or queue the caller.
--
-- KEYS[1] semaphore hash (l: limit, n: name, f: last fence)
-- KEYS[2] waiter queue  KEYS[3] waiter records  KEYS[4] permits ZSET
-- KEYS[5] permits' metadata (token -> msgpack {host, pid, thread, acquired ms, fence})
-- ARGV[1] token  ARGV[2] ttl ms  ARGV[3] name  ARGV[4] host  ARGV[5] pid
-- ARGV[6] thread  ARGV[7] 0 to try once, else ms the caller's waiter record
-- lives  ARGV[8] prefix of the wake lists  ARGV[9] '1': the caller gives up
-- waiting (leave the queue first; a permit already given to it is kept)
-- ARGV[10] limit  ARGV[11] '1' if the caller may hold or wait already (not
-- its first call): only then is that looked for
--
-- Returns {1, fence}:   holds a permit (also when already granted to ARGV[1]).
--         {0, ms}:      full; ms until the first permit expires. Queued if
--                       ARGV[7] > 0.
--         {-1, limit}:  live permits were taken with another limit (`limit`).
-- Waiters woken here receive "<fence>": they hold a permit.
-- Fences increase with every permit while the semaphore hash lives, and
-- follow the server clock (microseconds) otherwise.
local token = ARGV[1]
local ttl = tonumber(ARGV[2])
local live = tonumber(ARGV[7])
local limit = tonumber(ARGV[10])
if ARGV[9] == '1' then
  leave(KEYS[2], KEYS[3], ARGV[8], token)
end
local sem = redis.call('hmget', KEYS[1], 'l', 'f')
local stored = tonumber(sem[1])
local last = tonumber(sem[2]) or 0
-- The permits' keys expire with the semaphore hash: without it, none lives.
local count = 0
if stored then
  purge(KEYS[4], KEYS[5])
  count = redis.call('zcard', KEYS[4])
end
local opened = count == 0
if ARGV[11] == '1' then
  local held = redis.call('hget', KEYS[5], token)
  if held then
    return {1, cmsgpack.unpack(held)[5]}
  end
end
if count > 0 and stored ~= limit then
  return {-1, stored}
end
-- The latest expiry of a permit granted here.
local latest = 0

local function grant(w, r)
  local fence = now[1] * 1000000 + now[2]
  if fence <= last then
    fence = last + 1
  end
  last = fence
  fence = string.format('%.0f', fence)
  local expires = now_ms + r[2]
  if expires > latest then
    latest = expires
  end
  redis.call('zadd', KEYS[4], expires, w)
  redis.call('hset', KEYS[5], w, cmsgpack.pack({r[3], r[4], r[5], now_ms, fence}))
  return fence
end

local mine = nil
while count < limit do
  local w = redis.call('lpop', KEYS[2])
  if not w then
    break
  end
  local r = live_record(KEYS[3], w)
  if r then
    redis.call('hdel', KEYS[3], w)
    count = count + 1
    if w == token then
      mine = grant(w, {0, ttl, ARGV[4], ARGV[5], ARGV[6]})
    else
      wake(ARGV[8], w, r, grant(w, r))
    end
  end
end
if not mine and count < limit then
  mine = grant(token, {0, ttl, ARGV[4], ARGV[5], ARGV[6]})
end
redis.call('hset', KEYS[1], 'l', limit, 'n', ARGV[3], 'f', string.format('%.0f', last))
if opened and latest > 0 then
  -- Every permit was granted here: the latest of them is the last.
  expire_at({KEYS[1], KEYS[4], KEYS[5]}, latest)
else
  expire_with(KEYS[4], {KEYS[1], KEYS[4], KEYS[5]})
end
if mine then
  return {1, mine}
end
if live > 0 then
  enqueue(KEYS[2], KEYS[3], token, live, ttl, ARGV[4], ARGV[5], ARGV[6])
end
local first = redis.call('zrange', KEYS[4], 0, 0, 'withscores')
return {0, tonumber(first[2]) - now_ms}
