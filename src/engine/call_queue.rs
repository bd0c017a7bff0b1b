//! Calls to Redis waiting for the one in flight, per connection shard of one server: the
//! first looks of exclusive and fair locks, and their last releases. While one call of a kind
//! is in flight on a shard, those of that kind that come are gathered here, and go out
//! together as one call when it ends (see `gathered.rs` and `gathered_releases.rs`). A call
//! that comes when nothing of its kind is in flight goes out at once, alone: it waits for
//! nothing.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::error::Result;
use crate::keys::LockKeys;
use crate::lock_kind::LockKind;
use crate::wire::scripts::{AcquireMode, AcquireReply, AcquireTerms};

/// What Redis answered one run of the acquire script for an owner.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) sent_at: Instant,
    pub(crate) reply: AcquireReply,
    /// The epoch the script ran in, when it asked for a lease longer than the client knew
    /// of in it: a grant raises what the client knows.
    pub(crate) asked_in: Option<u64>,
}

impl Answer {
    /// Whether Redis may keep something of the owner after this answer to a first look in
    /// `mode`: the lock, or a place in its queue.
    pub(crate) fn keeps_something(&self, mode: AcquireMode) -> bool {
        match self.reply {
            AcquireReply::Acquired { .. } => true,
            AcquireReply::Waiting { .. } => mode != AcquireMode::Try,
            _ => false,
        }
    }
}

/// Whose look it is: an owner of a lock, and how long giving back what the look may leave in
/// Redis keeps trying.
#[derive(Debug, Clone)]
pub(crate) struct LookOwner {
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) owner: Arc<str>,
    pub(crate) kind: LockKind,
    pub(crate) mode: AcquireMode,
    pub(crate) undo_within: Duration,
}

/// A first look waiting in its shard's queue.
#[derive(Debug)]
pub(crate) struct QueuedLook {
    pub(crate) of: LookOwner,
    pub(crate) terms: AcquireTerms,
    /// Where its answer goes.
    pub(crate) answer: oneshot::Sender<Result<Answer>>,
}

/// The last release of an exclusive or fair lock waiting in its shard's queue.
#[derive(Debug)]
pub(crate) struct QueuedRelease {
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) owner: Arc<str>,
    /// Where its answer goes: the holds left (`None`: the owner held nothing).
    pub(crate) answer: oneshot::Sender<Result<Option<u64>>>,
}

/// Whether a call goes out at once or waits for the one in flight.
#[derive(Debug)]
pub(crate) enum Turn<R> {
    /// Nothing of its kind was in flight: the call goes out alone, now. The shard counts a
    /// call in flight until [`CallQueues::finished`] is told it ended.
    Alone,
    /// Queued: its answer comes here.
    Queued(oneshot::Receiver<R>),
}

/// One queue of calls `T` per connection shard.
#[derive(Debug)]
pub(crate) struct CallQueues<T> {
    shards: Box<[Mutex<ShardQueue<T>>]>,
}

#[derive(Debug)]
struct ShardQueue<T> {
    /// A call of this shard is in flight: one sent alone, or a gathered one.
    in_flight: bool,
    queued: Vec<T>,
}

impl<T> CallQueues<T> {
    /// Queues for `shards` connection shards.
    pub(crate) fn new(shards: usize) -> Self {
        Self {
            shards: (0..shards.max(1))
                .map(|_| {
                    Mutex::new(ShardQueue {
                        in_flight: false,
                        queued: Vec::new(),
                    })
                })
                .collect(),
        }
    }

    /// A call goes out alone when shard `shard` has nothing in flight; or else the call
    /// `queue` makes of the sender of its answer is queued.
    pub(crate) fn enter<R>(
        &self,
        shard: usize,
        queue: impl FnOnce(oneshot::Sender<R>) -> T,
    ) -> Turn<R> {
        let mut shard = self.shard(shard);
        if !shard.in_flight {
            shard.in_flight = true;
            return Turn::Alone;
        }
        let (answer, receiver) = oneshot::channel();
        shard.queued.push(queue(answer));
        Turn::Queued(receiver)
    }

    /// The call in flight of `shard` ended: the calls queued meanwhile, which the caller now
    /// sends (the shard keeps a call in flight), or none (and nothing is in flight).
    pub(crate) fn finished(&self, shard: usize) -> Vec<T> {
        let mut shard = self.shard(shard);
        let queued = std::mem::take(&mut shard.queued);
        shard.in_flight = !queued.is_empty();
        queued
    }

    fn shard(&self, shard: usize) -> std::sync::MutexGuard<'_, ShardQueue<T>> {
        self.shards[shard % self.shards.len()]
            .lock()
            .expect("call queue")
    }
}
