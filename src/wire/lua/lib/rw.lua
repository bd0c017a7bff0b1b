-- The read-write lock's state, shared by its scripts; needs the clock, the tokens and the
-- queue. LOCK, the lock hash, holds:
--   'mode'          'read' or 'write'
--   '<owner>'       a writer's hold count: '<holds>'; a reader's: '<holds> <lease deadline ms>'
--                   (server time), so every reader's lease runs out on its own
--   '<owner>:r'     the read holds a writer took inside its own write lock
-- and expires with the last reader's lease (a writer's: its lease). A hash without 'mode' is
-- held by a plain lock of the same name, or by a waiter a plain lock's release handed it to:
-- one owner, as exclusive as a writer.
-- READERS, a key of every read-write script, indexes the readers by lease deadline (a
-- sorted set: owner id -> deadline ms), so that no script visits every reader: expiring the
-- dead ones, finding the first and the last deadline, adding, renewing or removing one cost
-- O(log N). It exists only while the lock is read-held, and expires with the hash.
-- Waiters queue with 'r' or 'w' after their terms; a plain lock's waiters with nothing.

-- The readers' index lives exactly as long as the hash.
local function rw_readers_follow_hash()
  local left = redis.call('pttl', LOCK)
  if left > 0 then
    redis.call('pexpire', READERS, left)
  end
end

-- Reads the lock's state: nil (free), 'read', 'write' or 'plain'. In 'read' state it first
-- drops the readers whose lease ran out (only they are visited), deletes the hash when none
-- is left (then: nil), sets its expiry to the last live reader's deadline, and returns how
-- long the first one has left.
local function rw_state(now)
  local mode = redis.call('hget', LOCK, MODE_FIELD)
  if mode == MODE_WRITE then
    return 'write'
  end
  if mode ~= MODE_READ then
    if redis.call('exists', LOCK) == 1 then
      return 'plain'
    end
    return nil
  end
  local expired = redis.call('zrangebyscore', READERS, '-inf', now)
  if #expired > 0 then
    -- In slices: a call takes a bounded number of arguments.
    for i = 1, #expired, 1000 do
      redis.call('hdel', LOCK, unpack(expired, i, math.min(i + 999, #expired)))
    end
    redis.call('zremrangebyscore', READERS, '-inf', now)
  end
  local first = redis.call('zrange', READERS, 0, 0, 'WITHSCORES')[2]
  if not first then
    redis.call('del', LOCK, READERS)
    return nil
  end
  local last = tonumber(redis.call('zrange', READERS, -1, -1, 'WITHSCORES')[2])
  redis.call('pexpire', LOCK, last - now)
  redis.call('pexpire', READERS, last - now)
  return 'read', tonumber(first) - now
end

-- Adds `owner` as a reader with a lease of `lease_ms`; the hash lives at least that long.
-- Returns its fencing token.
local function rw_add_reader(owner, now, lease_ms, block)
  redis.call('hset', LOCK, MODE_FIELD, MODE_READ, owner, string.format('1 %d', now + lease_ms))
  redis.call('zadd', READERS, now + lease_ms, owner)
  if redis.call('pttl', LOCK) < lease_ms then
    redis.call('pexpire', LOCK, lease_ms)
  end
  rw_readers_follow_hash()
  return reserve_tokens(block, lease_ms, owner)
end

-- Makes `owner` the writer of a free lock. Returns its fencing token.
local function rw_take_write(owner, lease_ms, block)
  redis.call('hset', LOCK, MODE_FIELD, MODE_WRITE, owner, 1)
  redis.call('pexpire', LOCK, lease_ms)
  return reserve_tokens(block, lease_ms, owner)
end

-- Hands the lock to the queue as far as `state` allows: a free lock to the first live waiter
-- (one writer, one plain waiter, or the run of readers at the head together), a read-held one
-- to the run of readers at the head. Each grantee's instance is told, except `me`, the owner
-- running this script, which gets `me_lease` and whose token comes back. Returns that token
-- and lease (nil when `me` got nothing), the state after, and whether a live waiter is still
-- queued.
local function rw_grant(now, state, me, me_lease)
  if not anyone_queued() then
    return nil, nil, state, false
  end
  local my_token, my_lease
  while true do
    local head, grant_lease, block, _, role = live_head(now)
    if not head then
      return my_token, my_lease, state, false
    end
    local reader = role == ROLE_READ
    if state and not (state == 'read' and reader) then
      return my_token, my_lease, state, true
    end
    dequeue(head)
    local lease
    if head == me then
      lease = me_lease
    else
      lease = grant_lease
    end
    local token
    if reader then
      token, state = rw_add_reader(head, now, lease, block), 'read'
    elseif role == ROLE_WRITE then
      token, state = rw_take_write(head, lease, block), 'write'
    else
      token, state = take(head, lease, block), 'plain'
    end
    if head == me then
      my_token, my_lease = token, lease
    else
      announce_grant(head, token, 1, now, lease)
    end
  end
end

