-- Acquire a read-write lock for reading or writing, wait in its queue, or re-enter it.
-- The arguments and replies of acquire_free.lua, and ARGV[8] the role: 'read' or 'write'.
-- ARGV[4] may also be 'within' (role 'read'): a read hold for the owner of the write lock,
-- never waiting; {1, token, lease left} when it holds the write lock, {-1, 0, 0} otherwise.
-- A reader's lease left is its own, not the longest reader's.
local owner, mode, role = ARGV[2], ARGV[4], ARGV[8]
-- An owner Redis has never seen waits like any other here.
if mode == 'join' then
  mode = 'wait'
end
local lease, block = tonumber(ARGV[3]), tonumber(ARGV[5])
local taking = mode == 'wait' or mode == 'try'
-- A re-entry (or a read inside the write lock) adds to a hold of this epoch if it is still
-- there; a lost one is simply gone.
if taking then
  local blocked = check_epoch(KEYS[6], known_epoch, ARGV[6], quarantine_ms, ARGV[3])
  if blocked then
    return blocked
  end
end
-- The lock and its queue in one call: neither exists for most acquisitions. Keys moved for a
-- migrating slot are looked at one EXISTS each: the importing node refuses a command on
-- several keys it lacks.
local function lock_or_queue_exists()
  if keys_moved then
    return redis.call('exists', KEYS[1]) + redis.call('exists', KEYS[3]) > 0
  end
  return redis.call('exists', KEYS[1], KEYS[3]) > 0
end
if taking and not lock_or_queue_exists() then
  if role == 'read' then
    return {1, rw_add_reader(owner, now_ms(), lease, block), lease}
  end
  return {1, rw_take_write(owner, lease, block), lease}
end
local now = now_ms()
local state, first_left = rw_state(now)
local held = state and redis.call('hget', KEYS[1], owner)
if held then
  local holds, deadline = string.match(held, '^(%d+) ?(%d*)$')
  local left
  if deadline ~= '' then
    left = tonumber(deadline) - now
  else
    left = redis.call('pttl', KEYS[1])
  end
  if mode == 'within' then
    if state == 'read' then
      return {-1, 0, 0}
    end
    -- A plain lock's release handed this writer the lock: mark it write-held, so its read
    -- holds are told apart from its write holds.
    redis.call('hset', KEYS[1], 'mode', 'write')
    redis.call('hincrby', KEYS[1], owner .. ':r', 1)
    return {1, reserve_tokens(block, lease, owner), left}
  end
  if mode == 'reenter' then
    if role == 'read' and state == 'read' then
      redis.call('hset', KEYS[1], owner, string.format('%d %s', tonumber(holds) + 1, deadline))
    elseif role == 'read' and state == 'write' then
      redis.call('hincrby', KEYS[1], owner .. ':r', 1)
    elseif state == 'read' then
      -- A write guard of an owner that downgraded: its write holds are gone.
      return {-1, 0, 0}
    else
      redis.call('hincrby', KEYS[1], owner, 1)
    end
    return {1, 0, left}
  end
  -- Granted from the queue while this waiter was not listening: the last block granted ends
  -- at least at its token and below every later one (it expires with a lease; should it be
  -- gone, a fresh token grows as well).
  local top = string.match(redis.call('get', KEYS[2]) or '', '^%d+')
  if not top then
    return {1, reserve_tokens(1, math.max(1, left), owner), left}
  end
  return {1, tonumber(top), left}
end
if not taking then
  return {-1, 0, 0}
end
if state == nil or state == 'read' then
  local token, granted, waiting
  token, granted, state, waiting = rw_grant(now, state, owner, lease)
  if token then
    return {1, token, granted}
  end
  -- Nobody queued ahead: a free lock is taken, a read-held one joined by a reader. A reader
  -- never overtakes a queued writer.
  if not waiting then
    if state == nil and role == 'write' then
      return {1, rw_take_write(owner, lease, block), lease}
    end
    if state == nil or (state == 'read' and role == 'read') then
      return {1, rw_add_reader(owner, now, lease, block), lease}
    end
  end
end
if mode == 'wait' then
  local queued_role = 'w'
  if role == 'read' then
    queued_role = 'r'
  end
  -- Queued as a reader ('r') or a writer ('w'): the role follows the queue's own terms.
  if state == 'plain' then
    mark_queued()
  end
  enqueue(owner, now, tonumber(alive_ms), tonumber(grant_lease_ms), block, queued_role)
end
local left = redis.call('pttl', KEYS[1])
if first_left and first_left < left then
  -- Readers hold it: the first of their leases to run out may free the lock.
  left = first_left
end
return {0, left, now}
