-- Redlock, one node: make a fencing token chosen across nodes visible here.
--
-- KEYS[1] lease (string "<token>\n<fence>\n<holder description>")
-- KEYS[2] fencing counter
-- ARGV[1] token  ARGV[2] fencing token  ARGV[3] ms the fencing counter is kept
--
-- The counter is raised to ARGV[2] whether or not the lease is ours (it only
-- ever grows, so that is harmless and helps the nodes agree).
-- Returns 1: the lease is ARGV[1]'s and now carries the fencing token.
--         0: the lease is not ARGV[1]'s here.
if tonumber(ARGV[2]) > (tonumber(redis.call('get', KEYS[2])) or 0) then
  redis.call('set', KEYS[2], ARGV[2], 'px', ARGV[3])
end
local current = redis.call('get', KEYS[1])
local mine = ARGV[1] .. '\n'
if not current or string.sub(current, 1, #mine) ~= mine then
  return 0
end
local rest = string.match(current, '^[^\n]*\n[^\n]*\n(.*)$')
redis.call('set', KEYS[1], mine .. ARGV[2] .. '\n' .. rest, 'keepttl')
return 1
