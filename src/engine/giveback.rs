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

/// Releases the holds of `owner` that `scope` says (every one, and its place in the queue,
/// but for a read within a write lock) in a background task.
///
/// First on `conn`, the connection the last command went out on, behind it: a command still
/// on its way is undone after it runs. When that connection is broken, the command ran or
/// never will, and a fresh connection does; the task keeps trying for `within`, while what
/// Redis may hold for this owner could still keep the lock from others.
pub(crate) fn spawn_give_back(
    shared: Arc<ClientState>,
    keys: Arc<LockKeys>,
    kind: LockKind,
    owner: Arc<str>,
    scope: ReleaseScope,
    conn: Option<Conn>,
    within: Duration,
) {
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
                        shared.names(&keys),
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
