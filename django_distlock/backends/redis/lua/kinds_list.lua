-- Read the live holders of one shared lock or one semaphore, for listing.
--
-- KEYS[1] holders ZSET  KEYS[2] owner hash (lease hash or semaphore hash)
-- KEYS[3] holders' metadata hash
-- ARGV[1] a name prefix (bytes): other names are left out
-- ARGV[2] MARK for a shared lock (the lease hash's 't' must be it), '' for
-- a semaphore
--
-- Returns {} or {name, value, holder, holder, ...} where value is the lock's
-- fence (shared) or the semaphore's limit, and each holder is
-- {token, expiry ms, host, pid, thread, acquired ms, fence or ''}.
local owner = redis.call('hmget', KEYS[2], 't', 'f', 'n', 'l')
if ARGV[2] ~= '' and owner[1] ~= ARGV[2] then
  return {}
end
local name = owner[3]
if not name then
  return {}
end
if #ARGV[1] > 0 and string.sub(name, 1, #ARGV[1]) ~= ARGV[1] then
  return {}
end
local out = {name, (ARGV[2] ~= '' and owner[2]) or owner[4]}
local members = redis.call('zrangebyscore', KEYS[1], '(' .. now_ms, '+inf', 'withscores')
for i = 1, #members, 2 do
  local packed = redis.call('hget', KEYS[3], members[i])
  local m = packed and cmsgpack.unpack(packed) or {}
  out[#out + 1] = {members[i], members[i + 1], m[1] or '', m[2] or '', m[3] or '',
                   m[4] or 0, m[5] or ''}
end
if #out == 2 then
  return {}
end
return out
