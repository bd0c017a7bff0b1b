//! Group commit of last releases on one server: the last releases of exclusive and fair locks
//! granted from their queue (those taken with nobody queued go out as plain commands, see
//! `plain_release.rs`) that come while one of their connection is in flight wait in
//! `call_queue.rs`, and when it ends go out as one call of the release script run once per
//! release, as first looks do (see `gathered.rs`). A queued release goes out even when nobody
//! waits for its answer any more: the lock it frees is nobody's.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::engine::call_queue::{CallQueues, QueuedRelease, Turn};
use crate::engine::gathered::{AloneCall, MOST_PER_CALL};
use crate::engine::hold::Acquisition;
use crate::engine::plain_release;
use crate::engine::shared::ClientState;
use crate::error::{LockError, Result};
use crate::keys::LockKeys;
use crate::lock_kind::LockKind;
use crate::wire::scripts::{self, ReleaseScope};

/// Releases `acquisition`'s holds in `scope` (see `plain_release.rs`): the holds left
/// (`None`: it held nothing). With group commit, the last release of an exclusive or fair
/// lock on one server granted from its queue goes out alone when none of its connection is
/// in flight, or else with those that come meanwhile.
pub(crate) async fn release(acquisition: &Acquisition, scope: ReleaseScope) -> Result<Option<u64>> {
    let shared = &acquisition.shared;
    let gathered = shared.config.group_commit
        && scope == ReleaseScope::All
        && !shared.placement.may_send_again()
        && !acquisition.taken_unqueued
        && matches!(acquisition.terms.kind, LockKind::Exclusive | LockKind::Fair);
    if !gathered {
        return plain_release::release(acquisition, scope).await;
    }
    let shard = shared.connections.shard_of(acquisition.keys.hash());
    let queue = |answer| QueuedRelease {
        keys: acquisition.keys.clone(),
        owner: acquisition.owner.clone(),
        answer,
    };
    match shared.release_queues.enter(shard, queue) {
        Turn::Alone => {
            let _in_flight = AloneCall::new(shared, shard, release_queues, send_releases);
            acquisition.run_release_script(scope).await
        }
        // Never answered: the client is going away.
        Turn::Queued(answer) => answer.await.unwrap_or_else(|_| Err(LockError::shut_down())),
    }
}

/// The queues of last releases.
fn release_queues(shared: &ClientState) -> &CallQueues<QueuedRelease> {
    &shared.release_queues
}

/// Sends gathered releases, in calls of at most [`MOST_PER_CALL`].
fn send_releases(
    shared: Arc<ClientState>,
    releases: Vec<QueuedRelease>,
) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    Box::pin(async move {
        let mut releases = releases.into_iter().peekable();
        while releases.peek().is_some() {
            send_call(&shared, releases.by_ref().take(MOST_PER_CALL).collect()).await;
        }
    })
}

/// One call for `releases`, and their answers (to whoever still waits for them).
async fn send_call(shared: &Arc<ClientState>, releases: Vec<QueuedRelease>) {
    let key = releases[0].keys.hash();
    let outcome = match shared.connections.get(key).await {
        Ok(mut conn) => {
            let owners: Vec<(&LockKeys, &str)> = releases
                .iter()
                .map(|release| (&*release.keys, &*release.owner))
                .collect();
            let scope_keys = shared.scope_keys(&releases[0].keys);
            let call = scripts::release_each(&mut conn, &owners, scope_keys);
            shared.connections.bounded(key, call).await
        }
        Err(err) => Err(err),
    };
    match outcome {
        Ok(replies) => {
            for (release, reply) in releases.into_iter().zip(replies) {
                let answer = reply.map_err(|err| shared.connections.error_of(err));
                let _ = release.answer.send(answer);
            }
        }
        Err(err) => {
            for release in releases {
                let _ = release.answer.send(Err(err.for_another()));
            }
        }
    }
}
