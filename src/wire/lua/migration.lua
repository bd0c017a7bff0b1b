-- The keys and arguments every script reads (first in every script). In a cluster slot that
-- migrates, the client moves a script's keys to the importing node and runs the script there
-- with its first key alone declared (see `wire/migration.rs`): the other keys then come first
-- among the arguments, after a mark and their count, and are read back into KEYS here.
-- `KEYS_MOVED` says so; such a script writes no key it was not given (the epoch's marker).
local KEYS, ARGV = KEYS, ARGV
local KEYS_MOVED = ARGV[1] == '\0moved-keys'
if KEYS_MOVED then
  local count = tonumber(ARGV[2])
  local keys, args = {KEYS[1]}, {}
  for i = 1, count do
    keys[i + 1] = ARGV[2 + i]
  end
  for i = 3 + count, #ARGV do
    args[#args + 1] = ARGV[i]
  end
  KEYS, ARGV = keys, args
end

