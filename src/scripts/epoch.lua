-- The server's epoch (prepended to the scripts that take and renew locks).
-- One key names the life of this Redis's data: '<epoch>' or '<epoch> <quarantine until ms>'.
-- Each client remembers the epoch it last saw. Finding it missing or changed tells a Redis
-- that lost its data (a restart without persistence, a failover to an empty replica) from
-- one that kept it. The first client to find it missing starts a quarantine: no lock is
-- granted until every holder of a lost lock has been told, each by its own client.

-- Returns nil when `known` is the current epoch and no quarantine runs, {-2, epoch, 0} when
-- the caller must learn another epoch first, and {-3, quarantine left ms, server ms} during a
-- quarantine. `quarantine_ms` is how long a quarantine this caller starts lasts.
local function check_epoch(key, known, quarantine_ms)
  local current = redis.call('get', key)
  if current then
    local epoch, quarantine_until = string.match(current, '^(%d+) ?(%d*)$')
    if epoch ~= known then
      return {-2, tonumber(epoch), 0}
    end
    if quarantine_until == '' then
      return nil
    end
    local now = now_ms()
    local left = tonumber(quarantine_until) - now
    if left > 0 then
      return {-3, left, now}
    end
    redis.call('set', key, epoch)
    return nil
  end
  local epoch = now_us()
  if known ~= '0' then
    -- This client saw the data of an earlier epoch: it is gone.
    redis.call('set', key, string.format('%d %d', epoch, now_ms() + tonumber(quarantine_ms)))
  else
    -- A first start, or a client that never saw the earlier epoch: no loss is known.
    redis.call('set', key, string.format('%d', epoch))
  end
  return {-2, epoch, 0}
end

