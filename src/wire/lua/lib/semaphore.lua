-- A semaphore's state, shared by its scripts; needs the clock, the tokens and the queue.
-- LOCK, the semaphore's hash, holds:
--   'permits'   how many permits the semaphore has: every client must ask with this count
--   'used'      how many of them its holders hold
--   '<owner>'   a holder: '<permits taken> <lease deadline ms> <fencing token>' (server
--               time), so every holder's lease runs out on its own, as a reader's of a
--               read-write lock does, and a holder that learns of its grant late still
--               finds its own token (the counter's top may be a later holder's by then)
-- and expires with the longest lease among its holders: nothing is left of a semaphore
-- nobody holds, and a dead holder's permits come back when its own lease runs out.
-- HOLDERS, a key of every semaphore script, indexes the holders by lease deadline (a
-- sorted set: owner id -> deadline ms; the key a read-write lock keeps its readers in, which
-- the watchdog's renewal already moves), so no script visits every holder.
-- Waiters queue with the number of permits they ask for after their terms.

-- The semaphore's key and its index expire with the longest lease among its holders; with
-- no permit held, both are gone.
local function sem_settle(now, used)
  if used <= 0 then
    redis.call('del', LOCK, HOLDERS)
    return
  end
  local last = tonumber(redis.call('zrange', HOLDERS, -1, -1, 'WITHSCORES')[2])
  local left = math.max(1, last - now)
  redis.call('pexpire', LOCK, left)
  redis.call('pexpire', HOLDERS, left)
end

-- Reads the semaphore's state: its permit count (nil when nobody holds it) and how many are
-- held, after dropping the holders whose lease ran out (only they are visited).
local function sem_state(now)
  local stored = redis.call('hmget', LOCK, PERMITS_FIELD, USED_FIELD)
  local permits, used = tonumber(stored[1]), tonumber(stored[2] or '0')
  if not permits then
    return nil, 0
  end
  local expired = redis.call('zrangebyscore', HOLDERS, '-inf', now)
  if #expired > 0 then
    for i = 1, #expired do
      local held = redis.call('hget', LOCK, expired[i])
      if held then
        used = used - tonumber(string.match(held, '^(%d+)'))
      end
    end
    -- In slices: a call takes a bounded number of arguments.
    for i = 1, #expired, 1000 do
      redis.call('hdel', LOCK, unpack(expired, i, math.min(i + 999, #expired)))
    end
    redis.call('zremrangebyscore', HOLDERS, '-inf', now)
    redis.call('hset', LOCK, USED_FIELD, math.max(0, used))
    sem_settle(now, used)
    if used <= 0 then
      return nil, 0
    end
  end
  return permits, used
end

-- Gives `owner` `take` of the semaphore's `permits` on a lease of `lease_ms`; the key lives
-- at least that long. Returns its fencing token.
local function sem_add(owner, now, lease_ms, block, take, permits)
  local token = reserve_tokens(block, lease_ms, owner)
  redis.call('hset', LOCK, PERMITS_FIELD, permits, owner,
    string.format('%d %d %d', take, now + lease_ms, token))
  redis.call('hincrby', LOCK, USED_FIELD, take)
  redis.call('zadd', HOLDERS, now + lease_ms, owner)
  if redis.call('pttl', LOCK) < lease_ms then
    redis.call('pexpire', LOCK, lease_ms)
    redis.call('pexpire', HOLDERS, lease_ms)
  end
  return token
end

-- Hands permits to the queue in order: each live waiter at the head gets what it asked for
-- while that fits, and the first that does not fit stops the walk, so nobody behind it
-- overtakes it (a waiter for many permits is never starved by later waiters for few). Each
-- grantee's instance is told, except `me`, the owner running this script, which gets
-- `me_lease` and whose token comes back. Returns that token and lease (nil when `me` got
-- nothing), the permits held after, and whether a live waiter is still queued.
local function sem_grant(now, permits, used, me, me_lease)
  if not anyone_queued() then
    return nil, nil, used, false
  end
  local my_token, my_lease
  while true do
    local head, grant_lease, block, _, rest = live_head(now)
    if not head then
      return my_token, my_lease, used, false
    end
    local take = tonumber(rest) or 1
    if used + take > permits then
      return my_token, my_lease, used, true
    end
    dequeue(head)
    local lease
    if head == me then
      lease = me_lease
    else
      lease = grant_lease
    end
    local token = sem_add(head, now, lease, block, take, permits)
    used = used + take
    if head == me then
      my_token, my_lease = token, lease
    else
      announce_grant(head, token, 1, now, lease)
    end
  end
end
