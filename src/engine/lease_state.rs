//! The state of one lease, shared by the local holders of an acquisition and the watchdog:
//! the lost signal, the deadline, and the current holder's turn on the key.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::engine::deadlines::Watched;
use crate::engine::local::LocalTurn;
use crate::keys::display_name;
use crate::lease::LostReason;
use crate::meter;

/// Shared by the local holders of one Redis acquisition and the watchdog: the lost signal,
/// the lease's deadline, and the current holder's turn on the key. A lock released on
/// purpose is taken out of the watchdog first, so it is not reported lost.
#[derive(Debug)]
pub(crate) struct LeaseState<B> {
    lost: watch::Sender<Option<LostReason>>,
    /// When the holder must be told the lease is lost unless a renewal succeeds first; the
    /// watchdog moves it on. Past it the lease is not used, even before the watchdog fires.
    deadline: AtomicU64,
    /// Kept until the lock is released in Redis or handed to the next local task, so no task
    /// of this client overtakes the release; given up as soon as the lease is lost, so this
    /// client's other tasks compete for the lock again instead of queueing behind a guard
    /// that no longer holds it.
    turn: Mutex<HoldersTurn<B>>,
}

/// The current holder's turn on the key, and which of the lease's local holders it belongs
/// to (0 for the first, one more for each the lock was handed to): a holder that ends gives
/// up its own turn only, never the turn of the holder it handed the lock to.
#[derive(Debug)]
struct HoldersTurn<B> {
    holder: u64,
    turn: Option<LocalTurn<B>>,
}

impl<B> LeaseState<B> {
    /// The state of a lease whose holder has `turn` on the key (none for the kinds that do
    /// not queue locally).
    pub(crate) fn new(turn: Option<LocalTurn<B>>, deadline: Instant) -> Self {
        Self {
            lost: watch::Sender::new(None),
            deadline: AtomicU64::new(nanos_since_base(deadline)),
            turn: Mutex::new(HoldersTurn { holder: 0, turn }),
        }
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.borrow().is_some()
    }

    /// Whether the lease can still be vouched for: not reported lost, and its deadline not
    /// passed (a stalled runtime may not have run the watchdog yet).
    pub(crate) fn is_live(&self) -> bool {
        nanos_since_base(Instant::now()) < self.deadline.load(Ordering::Acquire) && !self.is_lost()
    }

    /// When the holder must be told the lease is lost unless a renewal comes first.
    pub(crate) fn deadline(&self) -> Instant {
        base_instant() + Duration::from_nanos(self.deadline.load(Ordering::Acquire))
    }

    /// Moves the deadline to `deadline` (a renewal, or a registration with the watchdog).
    pub(crate) fn extend_to(&self, deadline: Instant) {
        self.deadline
            .store(nanos_since_base(deadline), Ordering::Release);
    }

    /// Gives up the holder's turn on the key: the next local task may go on.
    pub(crate) fn give_up_turn(&self) {
        let turn = self.turn.lock().expect("local turn").turn.take();
        drop(turn);
    }

    /// Gives up the turn of the local holder numbered `holder`, if the turn is still its
    /// own (see [`LeaseState::put_turn`]).
    pub(crate) fn give_up_turn_of(&self, holder: u64) {
        let mut current = self.turn.lock().expect("local turn");
        let turn = if current.holder == holder {
            current.turn.take()
        } else {
            None
        };
        drop(current);
        drop(turn);
    }

    /// The current holder's turn, if it still has it and `wanted` says so.
    pub(crate) fn take_turn_if(
        &self,
        wanted: impl FnOnce(&LocalTurn<B>) -> bool,
    ) -> Option<LocalTurn<B>> {
        let mut current = self.turn.lock().expect("local turn");
        if current.turn.as_ref().is_some_and(wanted) {
            current.turn.take()
        } else {
            None
        }
    }

    /// Whether other tasks of this client wait for the key this lease's holder has.
    pub(crate) fn turn_has_others_waiting(&self) -> bool {
        let current = self.turn.lock().expect("local turn");
        current.turn.as_ref().is_some_and(LocalTurn::others_waiting)
    }

    /// Gives the turn of a local successor to this lease; returns the successor's number,
    /// by which it gives up its own turn when it ends.
    pub(crate) fn put_turn(&self, turn: LocalTurn<B>) -> u64 {
        let holder = {
            let mut current = self.turn.lock().expect("local turn");
            current.holder += 1;
            current.turn = Some(turn);
            current.holder
        };
        if self.is_lost() {
            self.give_up_turn();
        }
        holder
    }

    /// Fires the lost signal once.
    fn fire_once(&self, lock: &str, reason: LostReason) {
        let fired = self.lost.send_if_modified(|lost| {
            let first = lost.is_none();
            if first {
                *lost = Some(reason);
            }
            first
        });
        if fired {
            meter::lost(reason);
            tracing::warn!(
                lock = %display_name(lock),
                reason = meter::lost_label(reason),
                "lock lease lost"
            );
            self.give_up_turn();
        }
    }

    /// What the holders' lost signals listen to.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Option<LostReason>> {
        self.lost.subscribe()
    }
}

impl<B: Send + std::fmt::Debug> Watched for LeaseState<B> {
    fn fire(&self, lock: &str, reason: LostReason) {
        self.fire_once(lock, reason);
    }

    fn extend_to(&self, deadline: Instant) {
        LeaseState::extend_to(self, deadline);
    }
}

/// `at` as nanoseconds since the first moment this process asked: a deadline is checked on
/// every local hand-over, and an atomic number reads without a lock. A moment before that
/// first one counts as 0, past. A u64 of nanoseconds lasts 584 years.
fn nanos_since_base(at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(base_instant()).as_nanos()).unwrap_or(u64::MAX)
}

/// The first moment this process asked for a deadline: what [`nanos_since_base`] counts from.
fn base_instant() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}
