-- The witness of a promotion (engine/promotion_witness.rs): one key per server, one per slot
-- on a cluster, outside every prefix so that all of them share it,
-- '<replication id> <ms>': a client saw this server as a master under that replication id
-- for that long by its own monotonic clock. A promotion loses the writes its replica had not
-- received, a lease granted just before among them; once a witness vouches for the lease
-- limit, every lease granted before the promotion has run out, whatever a script's scope.

-- The witness beside the epoch key `key`: with its hash tag on a cluster, so that a script
-- of that slot may read it.
local function promotion_witness(key)
  local tag = string.match(key, '{[^{}]*}$')
  if tag then
    return 'tower-redis-lock:promoted:' .. tag
  end
  return 'tower-redis-lock:promoted'
end

-- Whether the server whose INFO `replication` is `replication` has a previous replication id
-- (a replica promoted, or a restart from an RDB file, which keeps one too).
local function was_promoted(replication)
  return not string.find(replication, 'master_replid2:' .. string.rep('0', 40), 1, true)
end

-- How long the witness `witness` (a GET's answer) vouches that the server has been a master
-- under `replication_id`, in ms: 0 when it names another or is missing.
local function vouched_ms(witness, replication_id)
  if type(witness) ~= 'string' then
    return 0
  end
  local id, vouched = string.match(witness, '^(%x+) (%d+)$')
  if id ~= replication_id then
    return 0
  end
  return tonumber(vouched)
end
