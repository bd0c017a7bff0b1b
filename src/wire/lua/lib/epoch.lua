-- The server's epoch, checked by the scripts that take and renew locks; needs the clock.
-- One key names the life of this Redis's data:
--   '<epoch> <quarantine until ms, 0 for none> <longest lease ms granted in this epoch>'.
-- Each client remembers the epoch and the longest lease it last saw. Finding the epoch missing
-- or changed tells a Redis that lost its data (a restart without persistence, a failover to
-- an empty replica, a flush) from one that kept it.
--
-- A missing epoch starts a quarantine unless the server has been up longer than it: no lock
-- is granted until every lease granted before could have run out, so a holder cut off from
-- Redis (which no client can tell) is told by its own lost signal before anyone else gets its
-- lock. The quarantine is counted from the server's start (Redlock's delayed restarts), which
-- covers a restart without persistence and spares a server up longer (new, or one that never
-- held a lock); a loss Redis shows without a restart is counted from now (see
-- quarantine_end). An operator ends a quarantine by hand (epoch_waive.lua).
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

-- Whether Redis shows a loss of data without a restart: a FLUSHALL or FLUSHDB run (or
-- refused) since its start, keys evicted, or a previous replication id (a replica promoted,
-- whose data came from a master that may have lost it; a restart from an RDB file, whose
-- writes since the file may be lost, keeps one too).
local function lost_without_restart()
  local evicted = string.match(redis.call('info', 'stats'), 'evicted_keys:(%d+)')
  local commands = redis.call('info', 'commandstats')
  local replication = redis.call('info', 'replication')
  return tonumber(evicted or '0') > 0
    or string.find(commands, 'cmdstat_flushall:', 1, true) ~= nil
    or string.find(commands, 'cmdstat_flushdb:', 1, true) ~= nil
    or string.find(replication, 'master_replid2:' .. string.rep('0', 40), 1, true) == nil
end

-- When the quarantine of `quarantine` ms for a missing epoch ends, in server ms (0: none).
local function quarantine_end(quarantine)
  local now = now_ms()
  if lost_without_restart() then
    return now + quarantine
  end
  -- Whole seconds of the server's clock since a start truncated to a whole second: up at
  -- least one second less (none, when its clock stepped back past the start).
  local uptime = string.match(redis.call('info', 'server'), 'uptime_in_seconds:(%-?%d+)')
  local up_ms = math.max(0, (tonumber(uptime) or 0) - 1) * 1000
  if up_ms >= quarantine then
    return 0
  end
  return now + quarantine - up_ms
end

-- `known` is the epoch the caller knows ('0' for none) and `known_lease` the longest lease it
-- knows of in that epoch; `quarantine_ms` the quarantine it starts on a missing epoch (at
-- least the longest lease it knows of), and `lease_ms` the lease it asks for, which becomes
-- the epoch's longest when longer (a caller need not learn a lease it set). `marker`, given
-- by acquisitions only, is the marker the caller named: it is deleted when the epoch is
-- missing, and the current epoch's marker is written when the caller may go on.
-- Returns nil when the caller may go on, {EPOCH_CHANGED, epoch, longest lease ms} when it
-- must learn them first, and {QUARANTINED, quarantine left ms, server ms} during a
-- quarantine.
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
    local ends = quarantine_end(math.max(tonumber(quarantine_ms), lease))
    redis.call('set', key, string.format('%d %d %d', new, ends, lease))
    return {EPOCH_CHANGED, new, lease}
  end
  if epoch ~= known or tonumber(longest) > math.max(tonumber(known_lease), lease) then
    return {EPOCH_CHANGED, tonumber(epoch), tonumber(longest)}
  end
  local rewrite = lease > tonumber(longest)
  if quarantine_until ~= '0' then
    local now = now_ms()
    local left = tonumber(quarantine_until) - now
    if left > 0 then
      return {QUARANTINED, left, now}
    end
    quarantine_until, rewrite = '0', true
  end
  if rewrite then
    redis.call('del', epoch_marker(key, epoch, longest))
    longest = string.format('%d', math.max(lease, tonumber(longest)))
    redis.call('set', key, string.format('%s %s %s', epoch, quarantine_until, longest))
  end
  if marker and not KEYS_MOVED then
    redis.call('set', epoch_marker(key, epoch, longest), '')
  end
  return nil
end
