-- The server's epoch, checked by the scripts that take and renew locks; needs the clock, the
-- life (life.lua) and the promotion's witness (promotion.lua).
-- One key names the life of this Redis's data:
--   '<epoch> <quarantine until ms, 0 for none> <longest lease ms granted in this epoch>
--    <life>', the life ' <run id> <server ms> <last save s>' of the process that wrote it
--   (absent when an operator wrote the key: the next check records the process it finds).
-- Each client remembers the epoch and the longest lease it last saw. Finding the epoch missing
-- or changed tells a Redis that lost its data (a restart without persistence, a failover to
-- an empty replica, a flush) from one that kept it.
--
-- A restart keeps the epoch key when the server reloads a snapshot or an append-only file,
-- but not every write since: a snapshot misses what came after it, `appendfsync everysec`
-- up to a second. So a process that started after the life recorded was written counts as a
-- loss like a missing epoch, unless the client says its server fsyncs every write
-- (RESTART_KEEPS_WRITES, `appendfsync always`). A process that ran before it (a replica
-- promoted by a failover) took its data by replication, and keeps the epoch. Whether it
-- started after is read from its uptime, the server's wall clock (see the safety chapter).
--
-- A missing epoch starts a quarantine unless the server has been up longer than it: no lock
-- is granted until every lease granted before could have run out, so a holder cut off from
-- Redis (which no client can tell) is told by its own lost signal before anyone else gets its
-- lock. The quarantine is counted from the server's start (Redlock's delayed restarts), which
-- covers a restart with or without persistence and spares a server up longer (new, or one
-- that never held a lock); a loss Redis shows without a restart is counted from now (see
-- quarantine_end). An operator ends a quarantine by hand (epoch_waive.lua).
--
-- Beside it, a marker key `<epoch key>:<epoch>:<longest lease ms>:<last save>` exists while
-- that epoch is current with that longest lease, no quarantine runs, and the life recorded is
-- the process's since its last save. A client that knows the epoch names the marker's first
-- part, an acquisition adds LASTSAVE (a restart or a snapshot changes it, so a marker that
-- came back with the data is never found) and finds it in the one EXISTS it makes of the lock
-- and its queue: most acquisitions check the epoch without reading it. The marker goes when
-- the longest lease grows or the life is recorded again; a lost epoch takes it along (an
-- epoch key deleted alone leaves a marker of an epoch nobody is in, which the next
-- acquisition from a client that knew it deletes).

-- Whether this server may have been promoted less than `quarantine` ms ago, from its INFO
-- `replication`: it has a previous replication id (a replica promoted, whose data came from
-- a master that may have lost it; a restart from an RDB file, whose writes since the file may
-- be lost, keeps one too) and no witness vouches for that long under its current one (see
-- promotion.lua). The witness is read with pcall: a user whose ACL leaves it out keeps the
-- quarantine.
local function promoted_within(key, quarantine, replication)
  if not was_promoted(replication) then
    return false
  end
  local witness = redis.pcall('get', promotion_witness(key))
  local id = string.match(replication, 'master_replid:(%x+)')
  return vouched_ms(witness, id) < quarantine
end

-- Whether Redis shows a loss of data without a restart that may have touched the scope of
-- the epoch key `key`, for a quarantine of `quarantine` ms: a FLUSHALL or FLUSHDB run (or
-- refused) since its start, keys evicted, or a promotion less than that long ago.
local function lost_without_restart(key, quarantine)
  local evicted = string.match(redis.call('info', 'stats'), 'evicted_keys:(%d+)')
  local commands = redis.call('info', 'commandstats')
  return tonumber(evicted or '0') > 0
    or string.find(commands, 'cmdstat_flushall:', 1, true) ~= nil
    or string.find(commands, 'cmdstat_flushdb:', 1, true) ~= nil
    or promoted_within(key, quarantine, redis.call('info', 'replication'))
end

-- When the quarantine of `quarantine` ms for the lost epoch at `key` ends, in server ms (0:
-- none). After a restart it is counted from the start: the signs of a loss without one (a
-- previous replication id among them, which a restart from a snapshot keeps) are about that
-- restart.
local function quarantine_end(key, quarantine, restarted)
  local now = now_ms()
  if not restarted and lost_without_restart(key, quarantine) then
    return now + quarantine
  end
  -- Whole seconds of the server's clock since a start truncated to a whole second: up at
  -- least one second less (none, when its clock stepped back past the start).
  local uptime = string.match(server_info(), 'uptime_in_seconds:(%-?%d+)')
  local up_ms = math.max(0, (tonumber(uptime) or 0) - 1) * 1000
  if up_ms >= quarantine then
    return 0
  end
  return now + quarantine - up_ms
end

-- Whether this server writes an append-only file, as a client told that it syncs every
-- write assumes: without one (snapshots alone, or no persistence), a restart loses writes
-- whatever the client was told. Its sync policy is not in INFO; the client's word stands
-- for it (the safety chapter says so).
local function appends_every_write()
  return string.find(redis.call('info', 'persistence'), 'aof_enabled:1', 1, true) ~= nil
end

-- `known` is the epoch the caller knows ('0' for none) and `known_lease` the longest lease it
-- knows of in that epoch; `quarantine_ms` the quarantine it starts on a missing epoch (at
-- least the longest lease it knows of), `lease_ms` the lease it asks for, which becomes the
-- epoch's longest when longer (a caller need not learn a lease it set), and `keeps_writes`
-- 'yes' when a restart loses no write. `marker`, given by acquisitions only, is the start of
-- the marker the caller named: it is deleted when the epoch is missing, and the current
-- epoch's marker is written when the caller may go on.
-- Returns nil when the caller may go on, {EPOCH_CHANGED, epoch, longest lease ms} when it
-- must learn them first, and {QUARANTINED, quarantine left ms, server ms} during a
-- quarantine.
local function check_epoch(key, known, known_lease, quarantine_ms, lease_ms, marker, keeps_writes)
  local lease = tonumber(lease_ms)
  local epoch, quarantine_until, longest, recorded
  local current = redis.call('get', key)
  if current then
    epoch, quarantine_until, longest, recorded = string.match(current, '^(%d+) (%d+) (%d+)(.*)$')
  end
  local change, life
  if epoch then
    change, life = life_change(recorded)
    if change == 'restarted' and not (keeps_writes == 'yes' and appends_every_write()) then
      -- The data of a process before a restart: the writes since its files may be gone.
      redis.call('del', epoch_marker(key, epoch, longest, saved_of(recorded)))
      epoch = nil
    end
  end
  if not epoch then
    -- Missing (or written by another version of this library, which counts as missing).
    if marker then
      redis.call('del', marker .. ':' .. last_save())
    end
    local new = now_us()
    local quarantine = math.max(tonumber(quarantine_ms), lease)
    local ends = quarantine_end(key, quarantine, change == 'restarted')
    redis.call('set', key, string.format('%d %d %d%s', new, ends, lease, life or life_now()))
    return {EPOCH_CHANGED, new, lease}
  end
  if epoch ~= known or tonumber(longest) > math.max(tonumber(known_lease), lease) then
    return {EPOCH_CHANGED, tonumber(epoch), tonumber(longest)}
  end
  local rewrite = lease > tonumber(longest) or life ~= nil
  if quarantine_until ~= '0' then
    local now = now_ms()
    local left = tonumber(quarantine_until) - now
    if left > 0 then
      return {QUARANTINED, left, now}
    end
    quarantine_until, rewrite = '0', true
  end
  if rewrite then
    redis.call('del', epoch_marker(key, epoch, longest, saved_of(recorded)))
    longest = string.format('%d', math.max(lease, tonumber(longest)))
    recorded = life or recorded
    redis.call('set', key,
      string.format('%s %s %s%s', epoch, quarantine_until, longest, recorded))
  end
  local saved = saved_of(recorded)
  if marker and saved ~= '0' then
    redis.call('set', epoch_marker(key, epoch, longest, saved), '')
  end
  return nil
end
