//! Group commit on one server ([`LockClientBuilder::group_commit`]), and its first looks: the
//! first looks at exclusive and fair locks that come while one of their connection is in
//! flight wait in `call_queue.rs`, and when it ends go out as one call of the acquire script
//! run once per look, which Redis charges once (the command, its parsing, the script's start).
//! What Redis does for each look, and what it answers, is what a look sent alone gets.
//! [`AloneCall`] sends what queued behind a call for any kind (releases: see
//! `gathered_releases.rs`).
//!
//! [`LockClientBuilder::group_commit`]: crate::LockClientBuilder::group_commit
//!
//! A queued look abandoned by its waiter (cancelled, timed out) is still answered: Redis may
//! have taken the lock or queued the owner for it, and whoever sees the answer last gives that
//! back, behind the gathered call on its connection, as a waiter does for a look sent alone.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::engine::call_queue::{Answer, CallQueues, LookOwner, QueuedLook};
use crate::engine::giveback::{GiveBack, spawn_give_back};
use crate::engine::shared::ClientState;
use crate::error::{LockError, Result};
use crate::keys::LockKeys;
use crate::wire::conn::Conn;
use crate::wire::scripts::{self, ReleaseScope};

/// The most looks (or releases) one call carries: a script blocks Redis while it runs, so a
/// long queue goes out in several calls.
pub(crate) const MOST_PER_CALL: usize = 32;

/// Sends calls of one kind gathered from a shard's queue: one or more calls to Redis.
pub(crate) type SendGathered<T> =
    fn(Arc<ClientState>, Vec<T>) -> Pin<Box<dyn Future<Output = ()> + Send>>;

/// Held while a call sent alone is in flight; when it ends (or its sender is cancelled), the
/// calls of its kind queued meanwhile go out together, and what queues meanwhile after them,
/// until nothing does.
pub(crate) struct AloneCall<T: Send + 'static> {
    shared: Arc<ClientState>,
    shard: usize,
    queues: fn(&ClientState) -> &CallQueues<T>,
    send: SendGathered<T>,
}

impl<T: Send + 'static> AloneCall<T> {
    /// A call of shard `shard`, whose kind queues in `queues` and goes out by `send`.
    pub(crate) fn new(
        shared: &Arc<ClientState>,
        shard: usize,
        queues: fn(&ClientState) -> &CallQueues<T>,
        send: SendGathered<T>,
    ) -> Self {
        Self {
            shared: shared.clone(),
            shard,
            queues,
            send,
        }
    }
}

impl<T: Send + 'static> Drop for AloneCall<T> {
    fn drop(&mut self) {
        let (queues, send, shard) = (self.queues, self.send, self.shard);
        let mut queued = queues(&self.shared).finished(shard);
        if queued.is_empty() {
            return;
        }
        let shared = self.shared.clone();
        self.shared.runtime.spawn(async move {
            while !queued.is_empty() {
                send(shared.clone(), queued).await;
                queued = queues(&shared).finished(shard);
            }
        });
    }
}

/// The queues of first looks.
pub(crate) fn look_queues(shared: &ClientState) -> &CallQueues<QueuedLook> {
    &shared.look_queues
}

/// Sends gathered first looks (see [`send_together`]).
pub(crate) fn send_looks(
    shared: Arc<ClientState>,
    looks: Vec<QueuedLook>,
) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    Box::pin(async move { send_together(&shared, looks).await })
}

/// The answer to a queued look; dropped before it is read, it gives back what Redis keeps of
/// the owner (see the module's note).
pub(crate) struct QueuedAnswer {
    receiver: oneshot::Receiver<Result<Answer>>,
    abandoned: Option<Abandoned>,
}

/// What giving back an abandoned look needs.
struct Abandoned {
    shared: Arc<ClientState>,
    of: LookOwner,
    conn: Conn,
}

/// Gives back what `answer` says Redis may keep of the owner of a look (an error: the look
/// may have run), on `conn` behind the call.
fn give_back_unseen(
    shared: &Arc<ClientState>,
    of: &LookOwner,
    answer: &Result<Answer>,
    conn: Conn,
) {
    let keeps = match answer {
        Ok(answer) => answer.keeps_something(of.mode),
        Err(_) => true,
    };
    if keeps {
        let give_back = GiveBack {
            keys: of.keys.clone(),
            kind: of.kind,
            owner: of.owner.clone(),
            scope: ReleaseScope::All,
            conn: Some(conn),
            within: of.undo_within,
        };
        spawn_give_back(shared.clone(), give_back);
    }
}

impl QueuedAnswer {
    /// The answer that comes by `receiver` to the look of `of`, whose connection is `conn`.
    pub(crate) fn new(
        shared: &Arc<ClientState>,
        receiver: oneshot::Receiver<Result<Answer>>,
        of: LookOwner,
        conn: Conn,
    ) -> Self {
        Self {
            receiver,
            abandoned: Some(Abandoned {
                shared: shared.clone(),
                of,
                conn,
            }),
        }
    }
}

impl Future for QueuedAnswer {
    type Output = Result<Answer>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let answer = match Pin::new(&mut self.receiver).poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Ok(answer)) => answer,
            // Never answered: the client is going away.
            Poll::Ready(Err(_)) => Err(LockError::shut_down()),
        };
        self.abandoned = None;
        Poll::Ready(answer)
    }
}

impl Drop for QueuedAnswer {
    fn drop(&mut self) {
        let Some(abandoned) = self.abandoned.take() else {
            return;
        };
        // Closed first: an answer sent after this fails to arrive, and its sender gives back
        // what it says; one that arrived before is read here, and given back here.
        self.receiver.close();
        if let Ok(answer) = self.receiver.try_recv() {
            give_back_unseen(&abandoned.shared, &abandoned.of, &answer, abandoned.conn);
        }
    }
}

/// Sends `queued` in as few calls as the looks' terms allow: the looks of one call share
/// their terms and mode.
async fn send_together(shared: &Arc<ClientState>, mut queued: Vec<QueuedLook>) {
    // A waiter gone before its look went out needs nothing of Redis.
    queued.retain(|look| !look.answer.is_closed());
    while let Some(first) = queued.first() {
        let (terms, mode) = (first.terms, first.of.mode);
        let (alike, rest): (Vec<_>, Vec<_>) = queued
            .into_iter()
            .partition(|look| look.terms == terms && look.of.mode == mode);
        queued = rest;
        let mut alike = alike.into_iter().peekable();
        while alike.peek().is_some() {
            send_call(shared, alike.by_ref().take(MOST_PER_CALL).collect()).await;
        }
    }
}

/// One call for `looks`, which share their terms and mode, and their answers.
async fn send_call(shared: &Arc<ClientState>, looks: Vec<QueuedLook>) {
    let first = &looks[0];
    let (terms, mode) = (first.terms, first.of.mode);
    let key = first.of.keys.hash();
    let mut conn = match shared.connections.get(key).await {
        Ok(conn) => conn,
        Err(err) => {
            // Nothing was sent: nothing to give back.
            for look in looks {
                let _ = look.answer.send(Err(err.for_another()));
            }
            return;
        }
    };
    let epoch = shared.watchdog.epoch().known_for(&first.of.keys);
    let asked_in = (terms.lease_ms > epoch.known_lease_ms).then_some(epoch.known);
    let owners: Vec<(&LockKeys, &str)> = looks
        .iter()
        .map(|look| (&*look.of.keys, &*look.of.owner))
        .collect();
    let sent_at = Instant::now();
    let call = scripts::acquire_each(
        &mut conn,
        &owners,
        shared.scope_keys(&first.of.keys),
        &terms,
        mode,
        &epoch,
    );
    let replies = shared.connections.bounded(key, call).await;
    drop(owners);
    // As many replies as looks: the script's count is checked.
    let answers: Vec<Result<Answer>> = match replies {
        Ok(replies) => replies
            .into_iter()
            .map(|reply| {
                let answer = |reply| Answer {
                    sent_at,
                    reply,
                    asked_in,
                };
                reply
                    .map(answer)
                    .map_err(|err| shared.connections.error_of(err))
            })
            .collect(),
        Err(err) => looks.iter().map(|_| Err(err.for_another())).collect(),
    };
    deliver(shared, looks, answers, &conn);
}

/// Hands each look its answer; a look whose waiter is gone gets what Redis keeps of it given
/// back on `conn`, behind the call.
fn deliver(
    shared: &Arc<ClientState>,
    looks: Vec<QueuedLook>,
    answers: impl IntoIterator<Item = Result<Answer>>,
    conn: &Conn,
) {
    for (look, answer) in looks.into_iter().zip(answers) {
        if let Err(unseen) = look.answer.send(answer) {
            give_back_unseen(shared, &look.of, &unseen, conn.clone());
        }
    }
}
