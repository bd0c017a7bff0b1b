//! Gives a lock back in the background when nobody can wait for Redis: an abandoned wait
//! (which Redis may have granted unseen), or a last release whose reply was lost.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::engine::giveback_tracker::Running;
use crate::engine::shared::ClientState;
use crate::error::LockError;
use crate::keys::{LockKeys, display_name};
use crate::lock_kind::LockKind;
use crate::wire::conn::Conn;
use crate::wire::scripts::{self, ReleaseScope};

/// How long a give-back waits before trying again on a fresh connection.
const RETRY: Duration = Duration::from_millis(200);

/// What a give-back releases, and for how long it keeps trying.
pub(crate) struct GiveBack {
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) kind: LockKind,
    pub(crate) owner: Arc<str>,
    /// Which holds of `owner`: every one, and its place in the queue, but for a read within a
    /// write lock.
    pub(crate) scope: ReleaseScope,
    /// The connection the last command went out on, when a command may still be on its way
    /// on it.
    pub(crate) conn: Option<Conn>,
    /// How long to keep trying: while what Redis may hold for `owner` could keep the lock
    /// from others.
    pub(crate) within: Duration,
}

/// Releases what `give_back` names in a background task.
///
/// First on its connection, behind the command that went out last: a command still on its
/// way is undone after it runs. When that connection is broken, the command ran or never
/// will, and a fresh connection does; the task keeps trying for `within`.
pub(crate) fn spawn_give_back(shared: Arc<ClientState>, give_back: GiveBack) {
    let GiveBack {
        keys,
        kind,
        owner,
        scope,
        conn,
        within,
    } = give_back;
    shared.give_backs.begin();
    shared.runtime.clone().spawn(async move {
        let _running = Running::ends(&shared.give_backs);
        let started = Instant::now();
        let mut conn = conn;
        loop {
            let outcome = tokio::time::timeout(shared.connections.command_timeout(), async {
                let mut conn = match conn.take() {
                    Some(conn) => conn,
                    None => shared.connections.get(keys.hash()).await?,
                };
                shared.connections.note_sent();
                Ok::<_, LockError>(
                    scripts::release(
                        &mut conn,
                        &keys,
                        kind,
                        shared.scope_keys(&keys),
                        &owner,
                        scope,
                    )
                    .await?,
                )
            })
            .await
            .unwrap_or_else(|_| Err(LockError::command_timeout()));
            match outcome {
                Ok(released) => {
                    tracing::debug!(lock = %display_name(keys.hash()), ?released, "gave a lock back");
                    return;
                }
                Err(err) if started.elapsed() < within && shared.ensure_running().is_ok() => {
                    shared.connections.note_failure(keys.hash(), &err);
                    tokio::time::sleep(RETRY).await;
                }
                Err(err) => {
                    tracing::warn!(lock = %display_name(keys.hash()), error = %err, "could not give a lock back");
                    return;
                }
            }
        }
    });
}
