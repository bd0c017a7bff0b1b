-- Taking a lock and its fencing tokens (prepended to every script that takes one, before the
-- queue's functions: a lock found free is taken before those are even defined).
-- KEYS[1] the lock hash (owner id -> hold count, and the two fields below), KEYS[2] the
-- fencing counter.

-- Reserves `block` fencing tokens and returns the first: one for the acquisition, the rest
-- for the local hand-overs its instance may make without coming back to Redis. Tokens start
-- past both the counter and the server clock in microseconds, so they keep growing when the
-- counter is gone (expired, or Redis lost its data) or went back (a failover to a replica
-- that missed the last reservation): every token handed out before is below the clock, as
-- long as the servers' clocks never go back and one lock reserves fewer than a million
-- tokens a second. The counter expires `ttl_ms` (the lease) after its last reservation.
-- The block is written past the clock and the counter read back in the same SET: only a
-- counter already past the clock (a block reserved within the last few microseconds) costs
-- a second write. `ttl_ms` is best given as a string (see `take`).
local function reserve_tokens(block, ttl_ms)
  local first = now_us() + 1
  local counter = redis.call('set', KEYS[2], string.format('%d', first + block - 1), 'px', ttl_ms,
    'get')
  counter = tonumber(counter or '0')
  if counter >= first then
    first = counter + 1
    redis.call('set', KEYS[2], string.format('%d', first + block - 1), 'px', ttl_ms)
  end
  return first
end

-- A plain lock's hash says someone may wait for it with two fields, `queued` and `queued.2`
-- (owner ids always hold a ':'). Whoever queues behind a plain holder, or grants a plain lock
-- from the queue, sets them; the holder's release removes its own field and both in one HDEL,
-- whose count says whether it held the lock (odd) and whether anyone may wait (2 or more):
-- the release of a lock nobody waited for never looks at the queue (see queue.lua's
-- `mark_queued`).

-- Makes `owner` the holder of a free lock; `from_queue`: granted from (or past) its queue,
-- which may still hold others, so the hash says so. `lease_ms` may be the string a caller was
-- sent, passed on as is; a number is written with '%d' here, once, as Redis would write it
-- out with printf's '%.17g' for each call, which costs more.
local function take(owner, lease_ms, block, from_queue)
  if type(lease_ms) == 'number' then
    lease_ms = string.format('%d', lease_ms)
  end
  if from_queue then
    redis.call('hset', KEYS[1], owner, '1', 'queued', '1', 'queued.2', '1')
  else
    redis.call('hset', KEYS[1], owner, '1')
  end
  redis.call('pexpire', KEYS[1], lease_ms)
  return reserve_tokens(block, lease_ms)
end
