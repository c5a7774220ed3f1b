-- Push out the expiry of the lease if it is still ARGV[1]'s. Every nesting
-- level of one owner shares the lease, so renewals only ever lengthen it.
--
-- KEYS[1] lease hash  ARGV[1] token  ARGV[2] ttl ms
-- ARGV[3] '1': at least ARGV[2] ms from now (renewal: never shortens);
--         '0': exactly ARGV[2] ms from now (an explicit extend)
-- Returns the lease's remaining ms afterwards (> 0), or 0: not held by
-- ARGV[1] (nothing done).
if redis.call('hget', KEYS[1], 't') ~= ARGV[1] then
  return 0
end
local ms = tonumber(ARGV[2])
if ARGV[3] == '1' then
  local pttl = redis.call('pttl', KEYS[1])
  if pttl >= ms then
    return pttl
  end
end
redis.call('pexpire', KEYS[1], ms)
return ms
