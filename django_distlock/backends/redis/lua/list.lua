-- Read leases for listing, in one reply (no per-key round trip or reply
-- parsing on the client: through redis-py, packing and parsing a pipeline of
-- HMGET and PTTL costs the client several times what this costs the server).
--
-- Two forms:
--   KEYS given: read those lease hashes (Redis Cluster: one key per call).
--   no KEYS:    take one SCAN step here, ARGV[2] cursor, ARGV[3] MATCH
--               pattern, ARGV[4] COUNT (TYPE hash), and read what it found:
--               one round trip per step, and the keys never travel to the
--               client and back.
-- ARGV[1]: a lock name prefix (bytes); leases of other names are left out.
--
-- Returns an array: the next SCAN cursor ('0' when the scan is complete, and
-- always in the KEYS form), then two values per lease, as HMGET and PTTL
-- would answer them:
--   {token, fence, name, host, pid, thread, acquired ms}, pttl ms.
-- Keys that hold no lease (any more) are left out.
local keys = KEYS
local out = {'0'}
if #keys == 0 then
  local step = redis.call('scan', ARGV[2], 'match', ARGV[3], 'count', ARGV[4],
                          'type', 'hash')
  out[1] = step[1]
  keys = step[2]
end
local prefix = ARGV[1]
local plen = #prefix
local n = 1
for _, key in ipairs(keys) do
  local v = redis.call('hmget', key, 't', 'f', 'n', 'h', 'p', 'th', 'a')
  if v[1] and (plen == 0 or (v[3] and string.sub(v[3], 1, plen) == prefix)) then
    out[n + 1] = v
    out[n + 2] = redis.call('pttl', key)
    n = n + 2
  end
end
return out
