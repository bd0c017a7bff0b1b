-- Fencing tokens, and taking a lock found free (prepended to every script that takes one,
-- before the queue's functions: a lock found free is taken before those are even defined).
-- KEYS[1] the lock hash (owner id -> hold count, and the two fields of queue.lua), KEYS[2]
-- the fencing counter.

-- The largest token block a lock found free takes from the clock alone (`take_free`): it ends
-- at most this many µs past the clock, and no lease is shorter (1 ms).
local CLOCK_BLOCK_MAX = 1000

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

-- Makes `owner` the holder of a lock found free with nobody queued, and returns its first
-- token. While the counter is gone or behind the clock, the block starts past the clock alone
-- and nothing is written but the hold: every token handed out before is below the clock,
-- since a block taken this way ends at most `block` µs past it and outlives neither its
-- lease (at least 1 ms) nor the release its client sends no sooner than twice `block` µs
-- after the grant (engine/release_gate.rs); a force-unlock raises the counter past such a
-- block. A counter behind the clock is deleted, so a lock held on a block of the clock has no
-- counter (acquire.lua reads the counter as the holder's block).
local function take_free(owner, lease_ms, block)
  redis.call('hset', KEYS[1], owner, '1')
  redis.call('pexpire', KEYS[1], lease_ms)
  local counter = redis.call('get', KEYS[2])
  local first = now_us() + 1
  if block > CLOCK_BLOCK_MAX or (counter and tonumber(counter) >= first) then
    return reserve_tokens(block, lease_ms)
  end
  if counter then
    redis.call('del', KEYS[2])
  end
  return first
end
