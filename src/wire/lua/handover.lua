-- Release the last hold of an exclusive lock while another task of this instance waits
-- (NEXT_OWNER): pass the lock to the first live waiter and queue NEXT_OWNER behind it, or,
-- when nobody else waits, keep it with a fresh token block on a lease of LEASE_MS.
-- Replies: {PASSED, server ms, last token reserved in the scope} when the lock was passed on,
-- {KEPT, first token, tokens reserved} when it was kept, {NOT_HELD} when the owner no longer
-- held it.

--#include release_trace
--#include clock
--#include counter
--#include tokens
--#include queue_expiry
--#include queue

local now = now_ms()
if not redis.call('hget', LOCK, OWNER) then
  -- Passed on by an earlier run of this very hand-over (see release_trace.lua), which
  -- queued NEXT_OWNER: its answer again, with the scope's last token now.
  if released_before(OWNER) then
    return {PASSED, now, last_token()}
  end
  return {NOT_HELD}
end
local block = tonumber(TOKEN_BLOCK)
local head, grant_lease, head_block = pop_live_head(now)
if not head then
  redis.call('pexpire', LOCK, LEASE_MS)
  local first, reserved = reserve_tokens(block, LEASE_MS, OWNER)
  return {KEPT, first, reserved}
end
redis.call('hdel', LOCK, OWNER)
leave_release_trace(OWNER)
grant_to(head, now, grant_lease, head_block)
enqueue(NEXT_OWNER, now, tonumber(ALIVE_MS), tonumber(LEASE_MS), block)
return {PASSED, now, last_token()}
