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
--
-- Beside it, a marker key `<epoch key>:<epoch>:<longest lease ms>` exists while that epoch is
-- current with that longest lease and no quarantine runs. A client that knows both names the
-- marker, and an acquisition finds it in the one EXISTS it makes of the lock and its queue:
-- most acquisitions check the epoch without reading it. The marker goes when the longest
-- lease grows; a lost epoch takes it along (an epoch key deleted alone leaves a marker of an
-- epoch nobody is in, which the next acquisition from a client that knew it deletes).

-- The marker of `epoch` with `longest` (strings as the epoch key holds them).
local function epoch_marker(key, epoch, longest)
  return key .. ':' .. epoch .. ':' .. longest
end

-- `known` is the epoch the caller knows ('0' for none) and `known_lease` the longest lease it
-- knows of in that epoch; `quarantine_ms` the quarantine it starts on a missing epoch (at
-- least the longest lease it knows of), and `lease_ms` the lease it asks for, which becomes
-- the epoch's longest when longer (a caller need not learn a lease it set). `marker`, given
-- by acquisitions only, is the marker the caller named: it is deleted when the epoch is
-- missing, and the current epoch's marker is written when the caller may go on.
-- Returns nil when the caller may go on, {-2, epoch, longest lease ms} when it must learn
-- them first, and {-3, quarantine left ms, server ms} during a quarantine.
local function check_epoch(key, known, known_lease, quarantine_ms, lease_ms, marker)
  local lease = tonumber(lease_ms)
  local epoch, quarantine_until, longest
  local current = redis.call('get', key)
  if current then
    epoch, quarantine_until, longest = string.match(current, '^(%d+) (%d+) (%d+)$')
  end
  if not epoch then
    -- Missing (or written by another version of this library, which counts as missing).
    if marker then
      redis.call('del', marker)
    end
    local new = now_us()
    local quarantine = math.max(tonumber(quarantine_ms), lease)
    redis.call('set', key, string.format('%d %d %d', new, now_ms() + quarantine, lease))
    return {-2, new, lease}
  end
  if epoch ~= known or tonumber(longest) > math.max(tonumber(known_lease), lease) then
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
    redis.call('del', epoch_marker(key, epoch, longest))
    longest = string.format('%d', math.max(lease, tonumber(longest)))
    redis.call('set', key, string.format('%s %s %s', epoch, quarantine_until, longest))
  end
  if marker then
    redis.call('set', epoch_marker(key, epoch, longest), '')
  end
  return nil
end
