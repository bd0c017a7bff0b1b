-- Taking a lock found free, and reserving the block of a grant its waiter may find. Uses LOCK
-- (owner id -> hold count, and the two fields of queue.lua) and LAST_GRANT (the last token
-- block granted from the queue); needs the counter.

-- Reserves a block for a grant to `owner` that its waiter may find by a look: LAST_GRANT keeps
-- '<last token of the block> <first token> <owner>' for `ttl_ms`, the grant's lease (a look
-- reads it back, and takes it only when it names the owner that looks). `ttl_ms` is best
-- given as a string (see `take`). Returns the first token and how many were reserved.
local function reserve_tokens(block, ttl_ms, owner)
  local first, reserved = next_tokens(block)
  redis.call('set', LAST_GRANT, string.format('%d %d %s', first + reserved - 1, first, owner),
    'px', ttl_ms)
  return first, reserved
end

-- Makes `owner` the holder of a lock found free with nobody queued, and returns its first
-- token and how many were reserved. Nothing else is written: the block of an earlier grant
-- in LAST_GRANT names its own owner, so a look by this one never takes it. The tokens go out
-- in the script's reply alone.
local function take_free(owner, lease_ms, block)
  redis.call('hset', LOCK, owner, '1')
  redis.call('pexpire', LOCK, lease_ms)
  return next_tokens(block, true)
end
