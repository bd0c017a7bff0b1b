-- The life of the server's data as the epoch key records it (see epoch.lua): which process
-- wrote it and when, and the markers named after it; needs the clock.

-- The marker of `epoch` with `longest`, whose life was recorded at the last save `saved`
-- (strings as the epoch key holds them).
local function epoch_marker(key, epoch, longest, saved)
  return key .. ':' .. epoch .. ':' .. longest .. ':' .. saved
end

-- The last save a recorded life names ('0' for none: recorded in the very second of that
-- save, when a restart in the same second would show the same one, or not recorded).
local function saved_of(life)
  return string.match(life, ' (%d+)$') or '0'
end

local info_server
-- The server's INFO section on the process (its run id and uptime), read once per script.
local function server_info()
  if not info_server then
    info_server = redis.call('info', 'server')
  end
  return info_server
end

-- The life of this process as the epoch key records it, and the last save it names. That
-- save is recorded only when the clock is past its second, so that a restart within it is
-- never taken for the same life.
local function life_now()
  local run_id = string.match(server_info(), 'run_id:(%x+)')
  local saved = last_save()
  local now = now_ms()
  if math.floor(now / 1000) <= saved then
    saved = 0
  end
  return string.format(' %s %d %d', run_id, now, saved), saved
end

-- How this process relates to the `recorded` life: nil when it is that life and nothing
-- was saved since or can be recorded yet (nothing to write), else the life to record and
-- 'same' (the same process, or a life recorded by an operator), 'replaced' (a process that
-- ran before the record was written: a replica promoted) or 'restarted' (one that started
-- after it: its data came from its own files). Its start is its uptime back from now, in
-- whole seconds that Redis truncates and Valkey counts between truncated seconds: the latest
-- it can be is a second later, which is what counts, and a clock stepped back past the start
-- counts as a start now.
local function life_change(recorded)
  local run_id, at, saved = string.match(recorded, '^ (%x+) (%d+) (%d+)$')
  if saved and saved ~= '0' and tonumber(saved) == last_save() then
    return nil
  end
  local life, saved_now = life_now()
  if run_id == string.match(server_info(), 'run_id:(%x+)') then
    -- The same process: recorded again once its last save can be (see life_now).
    if tonumber(saved) == saved_now then
      return nil
    end
    return 'same', life
  end
  if not run_id then
    return 'same', life
  end
  local uptime = tonumber(string.match(server_info(), 'uptime_in_seconds:(%-?%d+)')) or 0
  if now_ms() - (math.max(0, uptime) - 1) * 1000 > tonumber(at) then
    return 'restarted', life
  end
  return 'replaced', life
end
