-- Record who leads a singleton task and since when, for operators (`lockctl inspect`):
-- LEADER = '<term> <server ms> <owner>', written only while OWNER holds LOCK (see
-- guarded_write.lua), at the start of each term; kept after it, so the last leader shows
-- too. Sent twice (a cluster's resend), it records the same leader a moment later.
-- Replies: {RECORDED}, or {REFUSED} when the owner does not hold the lock.

--#include clock

if redis.call('hexists', LOCK, OWNER) == 0 then
  return {REFUSED}
end
redis.call('set', LEADER, string.format('%s %d %s', TERM, now_ms(), OWNER))
return {RECORDED}
