-- The queue of a lock, shared by the scripts that hand a lock over; needs the clock, the
-- tokens and the queue's expiry. Uses LOCK (owner id -> hold count), QUEUE (the waiting
-- owners: a sorted set, owner id -> arrival), WAITER_TERMS (a hash: owner id -> '<alive
-- until ms> <grant lease ms> <token block>', and after a space whatever a kind of lock adds)
-- and WAKE_PREFIX (a waiter's instance listens on that prefix and its instance id).

-- A plain lock's hash says someone may wait for it with two fields, `queued` and `queued.2`
-- (owner ids always hold a ':'). Whoever queues behind a plain holder, or grants a plain lock
-- from the queue, sets them; the holder's release removes its own field and both in one HDEL,
-- whose count says whether it held the lock (odd) and whether anyone may wait (2 or more):
-- the release of a lock nobody waited for never looks at the queue (see `mark_queued`).

-- Makes `owner` the holder of a free lock granted from (or past) its queue, which may still
-- hold others, so the hash says so. `lease_ms` may be the string a caller was sent, passed on
-- as is; a number is written with '%d' here, once, as Redis would write it out with printf's
-- '%.17g' for each call, which costs more.
local function take(owner, lease_ms, block)
  if type(lease_ms) == 'number' then
    lease_ms = string.format('%d', lease_ms)
  end
  redis.call('hset', LOCK, owner, '1', QUEUED_FIELD, '1', QUEUED_SECOND_FIELD, '1')
  redis.call('pexpire', LOCK, lease_ms)
  return reserve_tokens(block, lease_ms, owner)
end

-- Tells a plain holder's release to look at the queue (see `take`): for a
-- waiter that joins a queue nobody was in, behind a lock taken while nobody waited.
local function mark_queued()
  redis.call('hset', LOCK, QUEUED_FIELD, '1', QUEUED_SECOND_FIELD, '1')
end

local function dequeue(owner)
  -- Terms are only ever written for a queued owner (enqueue, heartbeat).
  if redis.call('zrem', QUEUE, owner) == 1 then
    redis.call('hdel', WAITER_TERMS, owner)
  end
end

-- Puts `owner` at the back of the queue, or keeps its place, and extends its liveness; `rest`
-- (optional) is what a kind of lock adds to the terms. Arrival is the server's clock in
-- microseconds, read once per script: one ZADD NX places a newcomer behind everyone queued
-- before it and leaves a queued owner where it is. `fresh`: the caller knows nobody was
-- queued (the queue is created here).
local function enqueue(owner, now, alive_ms, grant_lease_ms, block, rest, fresh)
  redis.call('zadd', QUEUE, 'NX', string.format('%d', now_us()), owner)
  local terms = string.format('%d %d %d', now + alive_ms, grant_lease_ms, block)
  if rest then
    terms = terms .. ' ' .. rest
  end
  redis.call('hset', WAITER_TERMS, owner, terms)
  keep_queue(QUEUE, WAITER_TERMS, alive_ms, fresh)
end

-- A waiter's terms (false when it has none) while its liveness lasts at `now`: the lease of
-- a grant to it, token block, when its liveness runs out, and the rest (a kind's own field);
-- nil once it has run out.
local function live_terms(terms, now)
  if not terms then
    return nil
  end
  local alive, grant_lease, block, rest = string.match(terms, '^(%d+) (%d+) (%d+) ?(.*)$')
  -- Digits by the pattern: read by arithmetic (see clock.lua).
  alive = alive and alive + 0
  if alive and alive >= now then
    return grant_lease + 0, block + 0, alive, rest
  end
  return nil
end

-- The first waiter whose liveness has not run out, with the lease of a grant to it, token
-- block, when its liveness runs out, and the rest of its terms (a kind's own field); dead
-- ones are dropped on the way.
local function live_head(now)
  while true do
    local head = redis.call('zrange', QUEUE, 0, 0)[1]
    if not head then
      return nil
    end
    local grant_lease, block, alive, rest = live_terms(redis.call('hget', WAITER_TERMS, head), now)
    if grant_lease then
      return head, grant_lease, block, alive, rest
    end
    dequeue(head)
  end
end

-- Whether anyone waits in the queue (dead or alive); most locks have nobody, and then the
-- scripts skip the clock and the queue entirely.
local function anyone_queued()
  return redis.call('exists', QUEUE) == 1
end

-- Tells `owner`'s instance, and only it, that the lock is its owner's:
-- '<owner> <first token> <server ms> <lease ms> <tokens reserved>'. A wake prefix with a hash
-- tag is a cluster's (one channel per slot and instance, in the lock's slot): it is told with
-- sharded pub/sub, which stays on the slot's node instead of crossing the whole cluster bus.
local function announce_grant(owner, token, reserved, now, lease)
  local instance = string.match(owner, '^([^:]+)')
  local publish = string.find(WAKE_PREFIX, '{', 1, true) and 'spublish' or 'publish'
  redis.call(publish, WAKE_PREFIX .. instance,
    string.format('%s %d %d %d %d', owner, token, now, lease, reserved))
end

-- Takes the first live waiter out of the queue with its terms (as `live_head` returns them);
-- dead ones are dropped on the way. One ZPOPMIN where a look and a removal would take two.
local function pop_live_head(now)
  while true do
    local popped = redis.call('zpopmin', QUEUE)
    local head = popped[1]
    if not head then
      return nil
    end
    local terms = redis.call('hget', WAITER_TERMS, head)
    if terms then
      redis.call('hdel', WAITER_TERMS, head)
      local grant_lease, block, alive, rest = live_terms(terms, now)
      if grant_lease then
        return head, grant_lease, block, alive, rest
      end
    end
  end
end

-- Hands a free lock to `head`, taken out of the queue with its terms, and tells its instance.
-- The lease it is granted is the whole lease it asked for, so its holder is never told it
-- holds a lock on less (a waiter that died since its last heartbeat then holds the lock one
-- lease, as a holder that dies does). Returns that lease.
local function grant_to(head, now, grant_lease, block)
  local first, reserved = take(head, grant_lease, block)
  announce_grant(head, first, reserved, now, grant_lease)
  return grant_lease
end

-- Hands a free lock to the first live waiter, if there is one, and tells that waiter's
-- instance. For a caller that already knows someone is queued.
local function grant_live_head(now)
  now = now or now_ms()
  local head, grant_lease, block = pop_live_head(now)
  if head then
    grant_to(head, now, grant_lease, block)
  end
end

-- Hands a free lock to the first live waiter and tells that waiter's instance.
local function grant_head(now)
  if anyone_queued() then
    grant_live_head(now)
  end
end
