//! Replica acknowledgement: an acquisition is reported only once enough replicas have it, so
//! that a failover to one of them keeps it (`LockClientBuilder::min_replicas_acked`).
//!
//! WAIT counts the writes of the connection it is sent on, so it goes out on the same
//! connection as the write it vouches for, right after it (commands about one lock always
//! use one connection). A grant written by another client's release is covered by a write
//! of the waiter's own first: the replication stream is ordered, so replicas that have the
//! later write have the grant.

use crate::engine::config::millis;
use crate::engine::shared::Shared;
use crate::error::{ErrorKind, LockError, Result};
use crate::keys::shown;
use crate::wire::scripts;

/// Whether replica acknowledgement is asked for at all.
pub(crate) fn asked(shared: &Shared) -> bool {
    shared.config.replica_ack.is_some()
}

/// Waits until the replicas asked for have every write sent so far on `key`'s connection:
/// `Ok` at once when none are asked for, [`ErrorKind::ReplicasBehind`] when fewer
/// acknowledged within the timeout. The caller releases what it acquired on an error.
pub(crate) async fn acknowledged(shared: &Shared, key: &str) -> Result<()> {
    let Some(ack) = shared.config.replica_ack else {
        return Ok(());
    };
    let connections = &shared.connections;
    let mut conn = connections.get(key).await?;
    // WAIT blocks on the server for its timeout: the reply may take that long and more.
    let limit = ack.timeout + connections.command_timeout();
    let acked = connections
        .bounded_by(
            key,
            limit,
            scripts::wait_for_replicas(&mut conn, key, ack.replicas, millis(ack.timeout)),
        )
        .await
        .map_err(|err| match err.kind() {
            // The node refused or cut the WAIT because it is a replica now: a failover is
            // under way, and whether the new master has the acquisition is unknown.
            ErrorKind::Redis => LockError::with_source(
                ErrorKind::RedisUnavailable,
                "the acquisition could not be acknowledged: its master failed over",
                err,
            ),
            _ => err,
        })?;
    if acked >= ack.replicas {
        return Ok(());
    }
    tracing::warn!(
        lock = %shown(key),
        acked,
        asked = ack.replicas,
        "too few replicas acknowledged an acquisition within {:?}: it is released",
        ack.timeout
    );
    Err(LockError::new(
        ErrorKind::ReplicasBehind,
        format!(
            "{acked} of the {} replicas asked for acknowledged the acquisition within {:?}",
            ack.replicas, ack.timeout
        ),
    ))
}
