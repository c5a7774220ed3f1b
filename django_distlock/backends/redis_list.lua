-- Read the leases in KEYS for listing, in one reply (no per-key round trip
-- or reply parsing on the client).
--
-- KEYS: lease hashes found by SCAN (all on this server).
-- Returns a flat array, 8 values per key in KEYS order:
--   token, fence, name, host, pid, thread, acquired ms, pttl ms
-- where token is nil (false) when the key holds no lease any more.
local out = {}
local n = 0
for _, key in ipairs(KEYS) do
  local v = redis.call('hmget', key, 't', 'f', 'n', 'h', 'p', 'th', 'a')
  for j = 1, 7 do
    out[n + j] = v[j]
  end
  out[n + 8] = redis.call('pttl', key)
  n = n + 8
end
return out
