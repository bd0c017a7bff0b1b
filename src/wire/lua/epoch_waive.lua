-- Waive the restart quarantine (operators only): on a server known to be new, or once every
-- holder of a lock the server lost is known to have stopped. Gives a server without an epoch
-- its first one, with no quarantine; ends a quarantine that runs.
-- KEYS[1] the epoch key. Returns 1 when a quarantine was waived or never started, 0 when none
-- ran.
local current = redis.call('get', KEYS[1])
local epoch, quarantine_until, longest
if current then
  epoch, quarantine_until, longest = string.match(current, '^(%d+) (%d+) (%d+)$')
end
if not epoch then
  redis.call('set', KEYS[1], string.format('%d 0 0', now_us()))
  return 1
end
if quarantine_until == '0' or tonumber(quarantine_until) <= now_ms() then
  return 0
end
redis.call('set', KEYS[1], string.format('%s 0 %s', epoch, longest))
return 1
