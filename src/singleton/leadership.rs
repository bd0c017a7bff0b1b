//! What a leader's task gets: its term, the signal to stop, and writes that Redis applies only
//! while this instance leads.

use std::sync::Arc;

use tokio::sync::{RwLock, watch};

use crate::error::Result;
use crate::guard::LockGuard;
use crate::guarded_write::GuardedWrites;
use crate::lease::LostReason;

/// Why a leader's task is told to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StopReason {
    /// The lease was lost, or can no longer be vouched for: another instance may be granted
    /// the leadership once it runs out.
    Lost(LostReason),
    /// This instance is shutting down and hands the leadership over.
    ShutDown,
    /// The task returned, and its leadership was released: what a clone kept past the
    /// task's end sees.
    TaskEnded,
}

/// One term of leadership, given to the task that runs while this instance leads. Cheap to
/// clone; every clone stops leading together.
#[derive(Debug, Clone)]
pub struct Leadership {
    term: Arc<Term>,
}

/// What the clones of a [`Leadership`] share.
#[derive(Debug)]
struct Term {
    name: String,
    number: u64,
    /// The lock while this term lasts; taken out when the leadership is released, so a clone
    /// kept past its term writes nothing.
    guard: RwLock<Option<LockGuard>>,
    stop: watch::Receiver<Option<StopReason>>,
}

/// The side of a term the campaign keeps: it tells the task to stop and takes the lock back.
#[derive(Debug)]
pub(crate) struct TermControl {
    term: Arc<Term>,
    stop: watch::Sender<Option<StopReason>>,
}

impl Leadership {
    /// A term held by `guard`, and the campaign's side of it.
    pub(crate) fn begin(name: &str, guard: LockGuard) -> (Self, TermControl) {
        let (stop, stop_receiver) = watch::channel(None);
        let term = Arc::new(Term {
            name: name.to_owned(),
            number: guard.fencing_token(),
            guard: RwLock::new(Some(guard)),
            stop: stop_receiver,
        });
        let control = TermControl {
            term: Arc::clone(&term),
            stop,
        };
        (Self { term }, control)
    }

    /// The singleton's name.
    pub fn name(&self) -> &str {
        &self.term.name
    }

    /// The term: the fencing token of the lock this leadership holds. Every later leadership
    /// of this name, on any instance, after restarts and failovers, has a greater one; pass
    /// it to what the task writes elsewhere so that a stale leader's writes can be refused.
    pub fn term(&self) -> u64 {
        self.term.number
    }

    /// Whether this instance still leads: not told to stop, and its lease vouched for.
    pub fn is_leading(&self) -> bool {
        if self.term.stop.borrow().is_some() {
            return false;
        }
        self.term
            .guard
            .try_read()
            .is_ok_and(|guard| guard.as_ref().is_some_and(LockGuard::is_held))
    }

    /// Why the task was told to stop, if it was.
    pub fn stop_reason(&self) -> Option<StopReason> {
        *self.term.stop.borrow()
    }

    /// Resolves when the task must stop: finish or save what it does, and return. Past the
    /// singleton's [grace](crate::singleton::Singleton::grace), or the lease's end if that
    /// comes first, the task is dropped.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only waits.
    pub async fn stopping(&self) -> StopReason {
        let mut stop = self.term.stop.clone();
        let reason = stop
            .wait_for(Option::is_some)
            .await
            .ok()
            .and_then(|reason| *reason);
        // The sender lives as long as the campaign's side of the term, which tells a reason
        // before it goes; a term whose campaign was dropped stopped with its instance.
        reason.unwrap_or(StopReason::ShutDown)
    }

    /// Applies `writes` in Redis only while this leadership's lock is held there, checked by
    /// Redis in the script that writes: `Ok(true)` applied, `Ok(false)` refused. A stale
    /// leader (paused past its lease, cut off, or on a server that lost its data) writes
    /// nothing, and neither does a clone kept after the term ended.
    ///
    /// # Errors
    ///
    /// As [`LockGuard::write_if_held`].
    pub async fn write_if_leading(&self, writes: &GuardedWrites) -> Result<bool> {
        let guard = self.term.guard.read().await;
        match guard.as_ref() {
            Some(guard) => guard.write_if_held(writes).await,
            None => Ok(false),
        }
    }
}

impl TermControl {
    /// Tells the task to stop, for `reason`; the first reason told stays.
    pub(crate) fn tell_stop(&self, reason: StopReason) {
        self.stop.send_if_modified(|told| {
            let first = told.is_none();
            if first {
                *told = Some(reason);
            }
            first
        });
    }

    /// Takes the lock out of the term once its task is gone; a write of a clone kept past
    /// the term is awaited first.
    pub(crate) async fn end(self) -> Option<LockGuard> {
        self.tell_stop(StopReason::TaskEnded);
        self.term.guard.write().await.take()
    }
}
