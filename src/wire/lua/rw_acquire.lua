-- Acquire a read-write lock for reading or writing (ROLE: 'read' or 'write'), wait in its
-- queue, or re-enter it.
-- MODE: as acquire.lua's, or 'within' (ROLE 'read'): a read hold for the owner of the write
-- lock, never waiting; {ACQUIRED, token, lease left} when it holds the write lock,
-- {NOT_OWNER} otherwise.
-- Replies: as acquire.lua's. A reader's lease left is its own, not the longest reader's.

--#include clock
--#include saves
--#include counter
--#include tokens
--#include life
--#include promotion
--#include epoch
--#include slow_terms
--#include queue_expiry
--#include queue
--#include rw

local owner, mode, role = OWNER, MODE, ROLE
-- An owner Redis has never seen waits like any other here.
if mode == 'join' then
  mode = 'wait'
end
local lease, block = tonumber(LEASE_MS), tonumber(TOKEN_BLOCK)
local taking = mode == 'wait' or mode == 'try'
-- A re-entry (or a read inside the write lock) adds to a hold of this epoch if it is still
-- there; a lost one is simply gone.
if taking then
  local blocked = check_epoch(EPOCH, known_epoch, known_lease_ms, quarantine_ms, LEASE_MS, nil,
    keeps_writes)
  if blocked then
    return blocked
  end
end
-- The lock and its queue in one call: neither exists for most acquisitions.
local lock_and_queue
if taking then
  lock_and_queue = redis.call('exists', LOCK, QUEUE)
end
if lock_and_queue == 0 then
  if role == 'read' then
    return {ACQUIRED, rw_add_reader(owner, now_ms(), lease, block), lease}
  end
  return {ACQUIRED, rw_take_write(owner, lease, block), lease}
end
local now = now_ms()
local state, first_left = rw_state(now)
local held = state and redis.call('hget', LOCK, owner)
if held then
  local holds, deadline = string.match(held, '^(%d+) ?(%d*)$')
  local left
  if deadline ~= '' then
    left = tonumber(deadline) - now
  else
    left = redis.call('pttl', LOCK)
  end
  if mode == 'within' then
    if state == 'read' then
      return {NOT_OWNER}
    end
    -- A plain lock's release handed this writer the lock: mark it write-held, so its read
    -- holds are told apart from its write holds.
    redis.call('hset', LOCK, MODE_FIELD, MODE_WRITE)
    redis.call('hincrby', LOCK, owner .. READS_WITHIN_SUFFIX, 1)
    return {ACQUIRED, reserve_tokens(block, lease, owner), left}
  end
  if mode == 'reenter' then
    if role == 'read' and state == 'read' then
      redis.call('hset', LOCK, owner, string.format('%d %s', tonumber(holds) + 1, deadline))
    elseif role == 'read' and state == 'write' then
      redis.call('hincrby', LOCK, owner .. READS_WITHIN_SUFFIX, 1)
    elseif state == 'read' then
      -- A write guard of an owner that downgraded: its write holds are gone.
      return {NOT_OWNER}
    else
      redis.call('hincrby', LOCK, owner, 1)
    end
    return {ACQUIRED, 0, left}
  end
  -- Granted from the queue while this waiter was not listening: the last block granted ends
  -- at least at its token and below every later one (it expires with a lease; should it be
  -- gone, a fresh token grows as well).
  local top = string.match(redis.call('get', LAST_GRANT) or '', '^%d+')
  if not top then
    return {ACQUIRED, reserve_tokens(1, math.max(1, left), owner), left}
  end
  return {ACQUIRED, tonumber(top), left}
end
if not taking then
  return {NOT_OWNER}
end
if state == nil or state == 'read' then
  local token, granted, waiting
  token, granted, state, waiting = rw_grant(now, state, owner, lease)
  if token then
    return {ACQUIRED, token, granted}
  end
  -- Nobody queued ahead: a free lock is taken, a read-held one joined by a reader. A reader
  -- never overtakes a queued writer.
  if not waiting then
    if state == nil and role == 'write' then
      return {ACQUIRED, rw_take_write(owner, lease, block), lease}
    end
    if state == nil or (state == 'read' and role == 'read') then
      return {ACQUIRED, rw_add_reader(owner, now, lease, block), lease}
    end
  end
end
-- An owner that queues is told the last token reserved (see `last_token`); one that does not,
-- or that Redis has never seen ('join', see acquire.lua's step 6), 0.
local last = 0
if mode == 'wait' then
  local queued_role = ROLE_WRITE
  if role == 'read' then
    queued_role = ROLE_READ
  end
  -- Queued as a reader ('r') or a writer ('w'): the role follows the queue's own terms.
  if state == 'plain' then
    mark_queued()
  end
  enqueue(owner, now, alive_ms + 0, lease, block, queued_role)
  if MODE ~= 'join' then
    last = last_token()
  end
end
local left = redis.call('pttl', LOCK)
if first_left and first_left < left then
  -- Readers hold it: the first of their leases to run out may free the lock.
  left = first_left
end
return {WAITING, left, now, last}
