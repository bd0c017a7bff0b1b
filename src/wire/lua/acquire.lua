-- Acquire, continued (after acquire_checked.lua and the queue's functions): the lock is held,
-- or others wait for it.
-- The lease left on the lock, and whether it is free (-2: no such key), in one call.
local left = redis.call('pttl', KEYS[1])
local free = left == -2
-- An owner Redis has never seen ('join') holds nothing: only one that looked before may have
-- been granted the lock meanwhile.
if not free and mode ~= 'join' and redis.call('hexists', KEYS[1], owner) == 1 then
  if mode == 'reenter' then
    -- A re-entry adds a hold and keeps the current lease.
    redis.call('hincrby', KEYS[1], owner, '1')
    return {1, 0, left}
  end
  -- Granted from the queue while this waiter was not listening (a wake message missed):
  -- the last block granted is the one reserved for it, when it names this owner (it expires
  -- with the grant's lease; should it be gone, a fresh block grows as well).
  local top, granted_to = string.match(redis.call('get', KEYS[2]) or '', '^(%d+) (.+)$')
  if granted_to ~= owner then
    return {1, reserve_tokens(block, math.max(1, left), owner), left}
  end
  return {1, tonumber(top) - block + 1, left}
end
if mode == 'reenter' then
  return {-1, 0, 0}
end
if free then
  local blocked = may_grant()
  if blocked then
    return blocked
  end
end
local now = now_ms()
if free then
  -- Free, but others queued: the first live one gets it (this owner, if it is first).
  local head, grant_lease, head_block = pop_live_head(now)
  if not head or head == owner then
    return {1, take(owner, ARGV[3], block), lease}
  end
  left = grant_to(head, now, grant_lease, head_block)
end
if mode == 'wait' or mode == 'join' then
  -- A held lock that was the only key of the two found has nobody queued yet: its holder's
  -- release must now look at the queue. (A lock held while others wait says so already.)
  local fresh = not free and present == 1
  if fresh then
    mark_queued()
  end
  enqueue(owner, now, tonumber(alive_ms), tonumber(grant_lease_ms), block, nil, fresh)
end
return {0, left, now}
