-- Helpers of the shared-lock and semaphore scripts: prepended to each of
-- them (kinds_*.lua) when it is loaded, so every script stays one EVALSHA.
--
-- Holders of a shared lock or of a semaphore are a ZSET (token -> expiry,
-- server ms) beside a hash of their metadata (token -> msgpack), and both
-- expire with the owner hash, with the last holder. Expired members are
-- purged lazily, by the scripts that count holders, and are never counted:
-- the last live holder's release deletes the keys with them. Waiters use the
-- plain backend's queue: a list of tokens and a hash of msgpack records
-- {deadline_ms, ttl_ms, host, pid, thread}; a waiter blocks on its own wake
-- list "<wake prefix><token>".
local now = redis.call('time')
local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
-- The server clock in microseconds, as the string a fencing token is made of
-- (only scripts that make a token need it).
local function now_us()
  return now[1] .. string.format('%06d', now[2])
end
-- The owner hash's 't' while shared holders hold a lock (never a token).
local MARK = '*shared'

-- Drop the expired holders of ZSET z and their metadata in hash m.
local function purge(z, m)
  local dead = redis.call('zrangebyscore', z, '-inf', now_ms)
  if #dead > 0 then
    redis.call('zremrangebyscore', z, '-inf', now_ms)
    for _, token in ipairs(dead) do
      redis.call('hdel', m, token)
    end
  end
  return #dead
end

-- Make every key of `keys` expire at `at` (server ms), or at once if gone.
local function expire_at(keys, at)
  local left = at - now_ms
  if left < 1 then
    left = 1
  end
  for _, key in ipairs(keys) do
    redis.call('pexpire', key, left)
  end
end

-- Make every key of `keys` expire with the last holder of ZSET z.
local function expire_with(z, keys)
  local last = redis.call('zrange', z, -1, -1, 'withscores')
  if last[2] then
    expire_at(keys, tonumber(last[2]))
  end
end

-- Whether `token` is a live holder in ZSET z; if it expired, it is purged
-- with the other expired holders (their metadata in hash m).
local function holds(z, m, token)
  local score = redis.call('zscore', z, token)
  if score and tonumber(score) <= now_ms then
    purge(z, m)
    return false
  end
  return score ~= false
end

-- The live holders of ZSET z (an expired one is not purged here).
local function live_count(z)
  return redis.call('zcount', z, '(' .. now_ms, '+inf')
end

-- Return the live record of waiter w (nil if gone or expired: then dropped).
local function live_record(records, w)
  local packed = redis.call('hget', records, w)
  if not packed then
    return nil
  end
  local r = cmsgpack.unpack(packed)
  if r[1] <= now_ms then
    redis.call('hdel', records, w)
    return nil
  end
  return r
end

-- Queue (or refresh) the caller as a waiter whose record lives `live` ms.
local function enqueue(queue, records, token, live, ttl, host, pid, thread)
  local record = cmsgpack.pack({now_ms + live, ttl, host, pid, thread})
  if redis.call('hset', records, token, record) == 1 then
    redis.call('rpush', queue, token)
  end
  if redis.call('pttl', queue) < live then
    redis.call('pexpire', queue, live)
    redis.call('pexpire', records, live)
  end
end

-- Wake waiter w (its record r) with `message`.
local function wake(prefix, w, r, message)
  local list = prefix .. w
  redis.call('rpush', list, message)
  redis.call('pexpire', list, r[1] - now_ms + 1000)
end

-- Forget a waiter that gives up (ARGV[9] == '1' in the acquire scripts).
local function leave(queue, records, prefix, token)
  if redis.call('hdel', records, token) == 1 then
    redis.call('lrem', queue, 1, token)
  end
  redis.call('del', prefix .. token)
end
