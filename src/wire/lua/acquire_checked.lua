-- Acquire, continued (after acquire_free.lua, its terms and the epoch's functions): the lock
-- is held, or others wait for it, or the client must check the epoch.
-- The lease asked for, which a lock taken from the queue reports as its lease left.
local lease = tonumber(ARGV[3])
-- The epoch is checked before a lock is taken or granted, and only then: a look that finds
-- the lock held (or adds to a hold, which adds to a hold of this epoch if it is still there)
-- grants nothing, whatever happened to Redis's data.
local function may_grant()
  if epoch_current then
    return nil
  end
  return check_epoch(KEYS[6], known_epoch, ARGV[6], quarantine_ms, ARGV[3],
    KEYS[7])
end
if present == 0 and mode ~= 'reenter' then
  local blocked = may_grant()
  if blocked then
    return blocked
  end
  return take_free(owner, ARGV[3], block)
end
