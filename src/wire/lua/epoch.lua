-- The server's epoch (prepended to the scripts that take and renew locks).
-- One key names the life of this Redis's data:
--   '<epoch> <quarantine until ms, 0 for none> <longest lease ms granted in this epoch>'.
-- Each client remembers the epoch and the longest lease it last saw. Finding the epoch missing
-- or changed tells a Redis that lost its data (a restart without persistence, a failover to
-- an empty replica, a flush) from one that kept it.
--
-- A missing epoch always starts a quarantine: no lock is granted until every lease granted
-- before could have run out, so a holder cut off from Redis (which no client can tell) is
-- told by its own lost signal before anyone else gets its lock. A new server cannot be told
-- apart from one that lost its data; an operator who knows it is new waives the quarantine
-- (epoch_waive.lua).

-- `known` is the epoch the caller knows ('0' for none) and `known_lease` the longest lease it
-- knows of in that epoch; `quarantine_ms` the quarantine it starts on a missing epoch (at
-- least the longest lease it knows of), and `lease_ms` the lease it asks for, which becomes
-- the epoch's longest when longer.
-- Returns nil when the caller may go on, {-2, epoch, longest lease ms} when it must learn
-- them first, and {-3, quarantine left ms, server ms} during a quarantine.
local function check_epoch(key, known, known_lease, quarantine_ms, lease_ms)
  local lease = tonumber(lease_ms)
  local epoch, quarantine_until, longest
  local current = redis.call('get', key)
  if current then
    epoch, quarantine_until, longest = string.match(current, '^(%d+) (%d+) (%d+)$')
  end
  if not epoch then
    -- Missing (or written by another version of this library, which counts as missing).
    local new = now_us()
    local quarantine = math.max(tonumber(quarantine_ms), lease)
    redis.call('set', key, string.format('%d %d %d', new, now_ms() + quarantine, lease))
    return {-2, new, lease}
  end
  if epoch ~= known or tonumber(longest) > tonumber(known_lease) then
    return {-2, tonumber(epoch), tonumber(longest)}
  end
  local rewrite = lease > tonumber(longest)
  if quarantine_until ~= '0' then
    local now = now_ms()
    local left = tonumber(quarantine_until) - now
    if left > 0 then
      return {-3, left, now}
    end
    quarantine_until, rewrite = '0', true
  end
  if rewrite then
    redis.call('set', key, string.format('%s %s %d', epoch, quarantine_until,
      math.max(lease, tonumber(longest))))
  end
  return nil
end
