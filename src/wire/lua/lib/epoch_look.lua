-- What an acquire's first look found of the epoch: how many of its key and its marker (whose
-- name ends with the last save) exist, 0, 1 or 2. A script run per item reads them with its
-- first item's look alone (the others look at their lock and queue only): nothing in a call
-- writes them but a check of the epoch, which forgets this, and the rest of the call is the
-- same instant for them.
local epoch_seen
