-- Acquire an exclusive (or fair) lock, wait in its queue, or re-enter it.
-- MODE: 'wait' (join or keep a place in the queue when the lock is not free for this owner),
-- 'join' (the same for an owner Redis has never seen: it can hold nothing yet), 'try' (never
-- queue), 'reenter' (add a hold, never take). EPOCH_MARKER is the marker of the epoch and
-- longest lease the client knows (see epoch.lua); LEASE_WITHIN_KNOWN is 'yes' when the lease
-- asked for is no longer than that longest lease.
-- Replies: {ACQUIRED, first token, lease left ms, tokens reserved} when this owner holds the
-- lock (token 0 on a re-entry; the tokens reserved, the first and those for local
-- hand-overs, are TOKEN_BLOCK unless given: fewer when the scope's counter ran ahead, see
-- tokens.lua); {WAITING, holder's lease left ms, server ms, last token reserved in the scope
-- (0 when this owner did not queue, or joined: see step 6)} when it does not; {NOT_OWNER}
-- when a re-entry finds the lock no longer held by this owner; {EPOCH_CHANGED, epoch,
-- longest lease ms} when the client must learn them first; {QUARANTINED, left ms, server ms}
-- during a restart quarantine.
-- A lock taken at once with its whole block answers with its first token alone, which stands
-- for {ACQUIRED, token, the lease asked for, TOKEN_BLOCK}: Redis builds and sends a table at
-- about a tenth of an uncontended acquire and release.

--#include clock
--#include saves
--#include epoch_look
--#include counter
--#include tokens

-- 1. A free lock nobody waits for, in the epoch the client knows, is taken at once: most
-- acquisitions end here. The lock and its queue are missing (0), or one of them or both
-- exist (1, 2). The epoch is current when its key and the marker the client names both
-- exist, and the lease asked for is within the longest the epoch has granted: nothing to
-- read or write about the epoch then.
-- One EXISTS reads all four: the lock and the queue are named once each and the epoch and
-- its marker three times each, so the count is lock_and_queue + 3 * epoch_found (a second
-- EXISTS would be a ninth command for an uncontended acquire and release).
-- The marker's name ends with the server's last save, which a restart moves (epoch.lua);
-- formatted with '%d', which costs Redis less than `..` does with a number (the same text).
-- The items after the first of a script run per item look at their lock and queue alone
-- (epoch_look.lua): the epoch they see is the one the first saw, or that a check left.
local lock_and_queue, epoch_found
if epoch_seen then
  lock_and_queue, epoch_found = redis.call('exists', LOCK, QUEUE), epoch_seen
else
  local marker = string.format('%s:%d', EPOCH_MARKER, last_save())
  local count = redis.call('exists', LOCK, QUEUE, EPOCH, EPOCH, EPOCH, marker, marker, marker)
  lock_and_queue = count % 3
  epoch_found = (count - lock_and_queue) / 3
  epoch_seen = epoch_found
end
local epoch_current = epoch_found == 2 and LEASE_WITHIN_KNOWN == 'yes'
if lock_and_queue == 0 and MODE ~= 'reenter' and epoch_current then
  -- Read as a number once, by arithmetic (see clock.lua).
  local asked = TOKEN_BLOCK + 0
  local first, reserved = take_free(OWNER, LEASE_MS, asked)
  if reserved == asked then
    return first
  end
  return {ACQUIRED, first, LEASE_MS + 0, reserved}
end

-- The functions of the slower paths are created only when a script runs this far, and their
-- terms read.
--#include slow_terms
--#include queue_expiry
--#include queue

local lease = LEASE_MS + 0
local block = TOKEN_BLOCK + 0

-- 2. The epoch is checked before a lock is taken or granted, and only then: a look that finds
-- the lock held (or adds to a hold, which adds to a hold of this epoch if it is still there)
-- grants nothing, whatever happened to Redis's data.
-- The epoch's functions are created only when it is not current (a look at a held lock, a
-- hand-over, never needs them).
local function may_grant()
  if epoch_current then
    return nil
  end
--#include life
--#include promotion
--#include epoch
  local blocked = check_epoch(EPOCH, known_epoch, known_lease_ms, quarantine_ms, LEASE_MS,
    EPOCH_MARKER, keeps_writes)
  -- It may have written the epoch or its marker: the next item looks at them again.
  epoch_seen = nil
  return blocked
end

if lock_and_queue == 0 and MODE ~= 'reenter' then
  local blocked = may_grant()
  if blocked then
    return blocked
  end
  local first, reserved = take_free(OWNER, LEASE_MS, block)
  return {ACQUIRED, first, lease, reserved}
end

-- 3. The lock is held, or others wait for it. The lease left on the lock, and whether it is
-- free (-2: no such key), in one call.
local left = redis.call('pttl', LOCK)
local free = left == -2

-- 4. Held by this owner. An owner Redis has never seen ('join') holds nothing: only one that
-- looked before may have been granted the lock meanwhile.
if not free and MODE ~= 'join' and redis.call('hexists', LOCK, OWNER) == 1 then
  if MODE == 'reenter' then
    -- A re-entry adds a hold and keeps the current lease.
    redis.call('hincrby', LOCK, OWNER, '1')
    return {ACQUIRED, 0, left}
  end
  -- Granted from the queue while this waiter was not listening (a wake message missed):
  -- the last block granted is the one reserved for it, when it names this owner (it expires
  -- with the grant's lease; should it be gone, a fresh block grows as well).
  local top, first, granted_to = string.match(redis.call('get', LAST_GRANT) or '',
    '^(%d+) (%d+) (.+)$')
  if granted_to ~= OWNER then
    local fresh, reserved = reserve_tokens(block, math.max(1, left), OWNER)
    return {ACQUIRED, fresh, left, reserved}
  end
  return {ACQUIRED, tonumber(first), left, tonumber(top) - tonumber(first) + 1}
end
if MODE == 'reenter' then
  return {NOT_OWNER}
end

-- 5. Free, but others queued: the first live one gets it (this owner, if it is first).
if free then
  local blocked = may_grant()
  if blocked then
    return blocked
  end
end
local now = now_ms()
if free then
  local head, grant_lease, head_block = pop_live_head(now)
  if not head or head == OWNER then
    local first, reserved = take(OWNER, LEASE_MS, block)
    return {ACQUIRED, first, lease, reserved}
  end
  left = grant_to(head, now, grant_lease, head_block)
end

-- 6. Not this owner's: a waiting owner joins the queue, or keeps its place in it, and is told
-- the last token reserved (see `last_token`); an owner that does not wait is told 0, and so
-- is one Redis has never seen ('join'): it is queued here for the first time, and only a
-- queued owner is granted the lock, so every grant to it comes after this look, whatever
-- token it bears.
if MODE == 'wait' or MODE == 'join' then
  -- A held lock that was the only key of the two found has nobody queued yet: its holder's
  -- release must now look at the queue. (A lock held while others wait says so already.)
  local fresh = not free and lock_and_queue == 1
  if fresh then
    mark_queued()
  end
  enqueue(OWNER, now, alive_ms + 0, lease, block, nil, fresh)
  if MODE == 'join' then
    return {WAITING, left, now, 0}
  end
  return {WAITING, left, now, last_token()}
end
return {WAITING, left, now, 0}
