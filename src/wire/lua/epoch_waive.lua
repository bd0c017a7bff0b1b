-- Waive the restart quarantine (operators only): on a server known to be new, or once every
-- holder of a lock the server lost is known to have stopped. Gives a server without an epoch
-- its first one, with no quarantine; ends a quarantine that runs.
-- Replies: {WAIVED} when a quarantine was waived or never started, {NONE_RAN} when none
-- ran.

--#include clock

local current = redis.call('get', EPOCH)
local epoch, quarantine_until, longest
if current then
  epoch, quarantine_until, longest = string.match(current, '^(%d+) (%d+) (%d+)$')
end
if not epoch then
  redis.call('set', EPOCH, string.format('%d 0 0', now_us()))
  return {WAIVED}
end
if quarantine_until == '0' or tonumber(quarantine_until) <= now_ms() then
  return {NONE_RAN}
end
redis.call('set', EPOCH, string.format('%s 0 %s', epoch, longest))
return {WAIVED}
