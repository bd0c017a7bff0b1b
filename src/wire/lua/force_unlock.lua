-- Remove a lock whoever holds it (operators only); the first live waiter gets it next.
-- Returns 1 when a lock was removed, 0 when it was free. KEYS[5] is the readers' index of a
-- read-write lock of the same name (see rw.lua), which goes with its hash.

-- For a lock removed while held: its holder's block may have come from the clock and not be
-- over yet (see `take_free`), so the counter goes past the longest such block. It lasts a
-- second, far longer than the clock takes to pass it, so an operator can still see it.
local function outrun_clock_blocks()
  local floor = now_us() + CLOCK_BLOCK_MAX
  local counter = redis.call('get', KEYS[2])
  if not counter or tonumber(counter) < floor then
    redis.call('set', KEYS[2], string.format('%d', floor), 'px', '1000')
  end
end

if redis.call('del', KEYS[1], KEYS[5]) > 0 then
  outrun_clock_blocks()
  grant_head(nil)
  return 1
end
return 0
