//! Replica acknowledgement: an acquisition is reported only once enough replicas have it, so
//! that a failover to one of them keeps it (`LockClientBuilder::min_replicas_acked`).
//!
//! Since Redis 7.2 (and on every Valkey) WAIT counts only the writes of the connection it is
//! sent on; on 7.0 it counted every write the server had made. So every path that tells a
//! holder it holds (an acquisition, a re-entry, a read within a write lock, a grant by a
//! release's message or found by a look) ends here, and here a write of this client's own
//! goes out right before the WAIT, in one pipeline on one connection: the replication stream
//! is ordered, so replicas that have that write have the grant and everything before it,
//! whoever wrote it and whichever connection it went out on.

use crate::engine::config::millis;
use crate::engine::shared::ClientState;
use crate::error::{ErrorKind, LockError, Result};
use crate::keys::{LockKeys, display_name};
use crate::wire::scripts;

/// Whether replica acknowledgement is asked for at all.
pub(crate) fn asked(shared: &ClientState) -> bool {
    shared.config.replica_ack.is_some()
}

/// Waits until the replicas asked for have every write the master of `keys` made so far:
/// `Ok` at once when none are asked for, [`ErrorKind::ReplicasBehind`] when fewer
/// acknowledged within the timeout. The caller releases what it acquired on an error.
pub(crate) async fn acknowledged(shared: &ClientState, keys: &LockKeys) -> Result<()> {
    acknowledged_what(shared, keys, "acquisition").await
}

/// [`acknowledged`] for `what` the master of `keys` wrote last (an acquisition, a guarded
/// write), as its errors and logs name it.
pub(crate) async fn acknowledged_what(
    shared: &ClientState,
    keys: &LockKeys,
    what: &str,
) -> Result<()> {
    let Some(ack) = shared.config.replica_ack else {
        return Ok(());
    };
    let connections = &shared.connections;
    let key = keys.hash();
    let tokens_key = &shared.scope_keys(keys).tokens_key;
    let mut conn = connections.get(key).await?;
    // WAIT blocks on the server for its timeout: the reply may take that long and more.
    let limit = ack.timeout + connections.command_timeout();
    let acked = connections
        .bounded_by(
            key,
            limit,
            scripts::write_and_wait_for_replicas(
                &mut conn,
                tokens_key,
                ack.replicas,
                millis(ack.timeout),
            ),
        )
        .await
        .map_err(|err| match err.kind() {
            // The node refused or cut the WAIT because it is a replica now: a failover is
            // under way, and whether the new master has the acquisition is unknown.
            ErrorKind::Redis => LockError::with_source(
                ErrorKind::RedisUnavailable,
                format!("the {what} could not be acknowledged: its master failed over"),
                err,
            ),
            _ => err,
        })?;
    if acked >= ack.replicas {
        return Ok(());
    }
    tracing::warn!(
        lock = %display_name(key),
        acked,
        asked = ack.replicas,
        "too few replicas acknowledged the {what} within {:?}",
        ack.timeout
    );
    Err(LockError::new(
        ErrorKind::ReplicasBehind,
        format!(
            "{acked} of the {} replicas asked for acknowledged the {what} within {:?}",
            ack.replicas, ack.timeout
        ),
    ))
}
