-- First in every script a cluster client runs (a server's scripts go without it): a script
-- runs only on the node that owns its slot, and only while the slot is stable. While a slot
-- migrates, its owner (MIGRATING) and the node importing it (IMPORTING, for a client that
-- said ASKING) both refuse a command on several keys of the slot that they do not all have,
-- and no key has these two names: so in a migrating slot this EXISTS fails, before the
-- script's first write, on either node (the client tries again until the migration ends,
-- see `wire/lua.rs`). A stable owner answers 0. Lock state is then never written to a node
-- that does not own its slot, and a migration that is aborted (`CLUSTER SETSLOT … STABLE`)
-- strands none; a script never stops half way because a key it was about to write is not
-- on its node yet.
if KEYS[1] then
  redis.call('exists', KEYS[1] .. '\0stable-slot:1', KEYS[1] .. '\0stable-slot:2')
end
