-- A shared or permit waiter whose acquisition is in doubt (sent, no reply):
-- take it out of its queue, so that no release hands it a lease. What was
-- granted to it already is given back by the release scripts (a token
-- compare-and-delete), pipelined after this one.
--
-- KEYS[1] waiter queue  KEYS[2] waiter records  KEYS[3] the waiter's wake list
-- ARGV[1] token
-- Returns 1: it was queued (now left).  0: it was not.
redis.call('del', KEYS[3])
if redis.call('hdel', KEYS[2], ARGV[1]) == 1 then
  redis.call('lrem', KEYS[1], 1, ARGV[1])
  return 1
end
return 0
