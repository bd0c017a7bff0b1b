-- Release the last hold of an exclusive lock while another task of this instance waits
-- (NEXT_OWNER): pass the lock to the first live waiter and queue NEXT_OWNER behind it, or,
-- when nobody else waits, keep it with a fresh token block on a lease of LEASE_MS.
-- Replies: {PASSED, server ms, last token reserved in the scope} when the lock was passed on,
-- {KEPT, first token, tokens reserved} when it was kept, {NOT_HELD} when the owner no longer
-- held it.

--#include clock
--#include tokens
--#include queue_expiry
--#include queue

if not redis.call('hget', LOCK, OWNER) then
  return {NOT_HELD}
end
local now = now_ms()
local block = tonumber(TOKEN_BLOCK)
local head, grant_lease, head_block = pop_live_head(now)
if not head then
  redis.call('pexpire', LOCK, LEASE_MS)
  local first, reserved = reserve_tokens(block, LEASE_MS, OWNER)
  return {KEPT, first, reserved}
end
redis.call('hdel', LOCK, OWNER)
grant_to(head, now, grant_lease, head_block)
enqueue(NEXT_OWNER, now, tonumber(ALIVE_MS), tonumber(LEASE_MS), block)
return {PASSED, now, last_token()}
