-- How long a queue outlives its waiters (for the queue's functions and the heartbeat).
-- A queue (sorted set) and its waiters' terms (hash) expire together: members come and go
-- from both in the same script, and every script that extends one extends the other to the
-- same length, so the queue's expiry stands for both and only it is read.

-- Makes a queue and its terms live at least `alive_ms` longer (twice that when extended): a
-- place outlives the liveness just given to it, and a queue nobody refreshes any more
-- vanishes within twice a liveness. A queue with more than a liveness left is not touched, so
-- most joins and refreshes write no expiry, and a longer one (a waiter's with a longer
-- liveness) is never shortened. `fresh`: the caller knows the queue was created by this
-- script and has no expiry yet (nothing to read).
local function keep_queue(queue, waiters, alive_ms, fresh)
  if fresh or redis.call('pttl', queue) < alive_ms then
    local twice = string.format('%d', 2 * alive_ms)
    redis.call('pexpire', queue, twice)
    redis.call('pexpire', waiters, twice)
  end
end
