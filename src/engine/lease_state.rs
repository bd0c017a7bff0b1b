//! The state of one lease, shared by the local holders of an acquisition and the watchdog:
//! the lost signal, the deadline, and the local holder (its guards and its turn on the key).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::engine::deadlines::Watched;
use crate::engine::ending::{self, Entry, Event, Holding, NextLocal, Step};
use crate::engine::local::LocalTurn;
use crate::keys::display_name;
use crate::lease::LostReason;
use crate::meter;

/// Shared by the local holders of one Redis acquisition and the watchdog: the lost signal,
/// the lease's deadline, and who holds it locally. A lock released on purpose is taken out
/// of the watchdog first, so it is not reported lost.
#[derive(Debug)]
pub(crate) struct LeaseState<B> {
    lost: watch::Sender<Option<LostReason>>,
    /// When the holder must be told the lease is lost unless a renewal succeeds first; the
    /// watchdog moves it on. Past it the lease is not used, even before the watchdog fires.
    deadline: AtomicU64,
    /// The watchdog renews it: only such a lease passes from one local holder to the next
    /// (a fixed lease belongs to one holder).
    renewed: bool,
    /// The local holder: what a release decides from, read and changed under one mutex.
    holding: Mutex<CurrentHolder<B>>,
}

/// The local holder of a lease, one at a time: its guards, its re-entries on their way, and
/// its turn on the key.
#[derive(Debug)]
struct CurrentHolder<B> {
    /// Which of the lease's local holders this is (0 for the first, one more for each the
    /// lock was handed to): a holder that ends gives up its own turn only, never the turn of
    /// the holder it handed the lock to.
    number: u64,
    /// Its guards not yet released.
    guards: usize,
    /// Its re-entries on their way to Redis; the lock is not handed over meanwhile.
    reentering: usize,
    /// Its turn on the key: kept until the lock is released in Redis or handed to the next
    /// local task, so no task of this client overtakes the release; given up as soon as the
    /// lease is lost, so this client's other tasks compete for the lock again instead of
    /// queueing behind a guard that no longer holds it.
    turn: Option<LocalTurn<B>>,
}

impl<B> CurrentHolder<B> {
    /// The entry as [`ending::decide`] sees it.
    fn entry(&self, carriable: bool, budget_left: bool) -> Entry {
        if self.guards == 0 {
            return Entry::Releasing;
        }
        let others = self.turn.as_ref().is_some_and(LocalTurn::others_waiting);
        Entry::Held(Holding {
            guards: self.guards,
            reentering: self.reentering > 0,
            carriable,
            next: if others {
                NextLocal::Waits { budget_left }
            } else {
                NextLocal::Nobody
            },
        })
    }
}

impl<B> LeaseState<B> {
    /// The state of a lease, `renewed` by the watchdog or not, whose first holder has one
    /// guard and `turn` on the key (none for the kinds that do not queue locally).
    pub(crate) fn new(turn: Option<LocalTurn<B>>, deadline: Instant, renewed: bool) -> Self {
        Self {
            lost: watch::Sender::new(None),
            deadline: AtomicU64::new(nanos_since_base(deadline)),
            renewed,
            holding: Mutex::new(CurrentHolder {
                number: 0,
                guards: 1,
                reentering: 0,
                turn,
            }),
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

    /// One guard of the local holder numbered `number` is released: what to do, decided and
    /// counted at one moment, with the key's turn when the step carries the lock to the
    /// next local task. `budget_left`: the holder's fairness budget allows one more
    /// hand-over without Redis.
    pub(crate) fn release_guard(
        &self,
        number: u64,
        budget_left: bool,
    ) -> (Step, Option<LocalTurn<B>>) {
        let carriable = self.renewed && self.is_live();
        let mut current = self.holding.lock().expect("current holder");
        // Only the current holder has guards: a hold is passed on after its last release.
        if current.number != number || current.guards == 0 {
            return (Step::Nothing, None);
        }
        let step = ending::decide(current.entry(carriable, budget_left), Event::GuardReleased);
        current.guards -= 1;
        let turn = if step == Step::Carry {
            current.turn.take()
        } else {
            None
        };
        (step, turn)
    }

    /// A re-entry of the local holder numbered `number` leaves for Redis: the lock is not
    /// passed on before it is counted or refused.
    pub(crate) fn reentry_leaves(&self, number: u64) {
        let mut current = self.holding.lock().expect("current holder");
        if current.number == number {
            current.reentering += 1;
        }
    }

    /// The re-entry is back: a hold Redis `granted` counts as a guard while a guard of the
    /// holder lives (else the holder's last release, which releases every hold of the owner,
    /// takes it). Returns whether it counts.
    pub(crate) fn reentry_back(&self, number: u64, granted: bool) -> bool {
        let mut current = self.holding.lock().expect("current holder");
        if current.number != number {
            return false;
        }
        current.reentering = current.reentering.saturating_sub(1);
        let counted = granted && current.guards > 0;
        if counted {
            current.guards += 1;
        }
        counted
    }

    /// Gives up the turn of the local holder numbered `number` when it ends, if the turn is
    /// still its own.
    pub(crate) fn give_up_turn_of(&self, number: u64) {
        let mut current = self.holding.lock().expect("current holder");
        let turn = if current.number == number {
            current.turn.take()
        } else {
            None
        };
        drop(current);
        drop(turn);
    }

    /// The releasing holder's turn, if it still has it: what Redis left for the next task
    /// goes into it.
    pub(crate) fn take_turn(&self) -> Option<LocalTurn<B>> {
        self.holding.lock().expect("current holder").turn.take()
    }

    /// Makes the next local task the holder, with one guard and `turn`; returns its number,
    /// by which it gives up its own turn when it ends.
    pub(crate) fn next_holder(&self, turn: LocalTurn<B>) -> u64 {
        let (number, given_up) = {
            let mut current = self.holding.lock().expect("current holder");
            current.number += 1;
            current.guards = 1;
            current.reentering = 0;
            current.turn = Some(turn);
            let given_up = if self.is_lost() {
                current.turn.take()
            } else {
                None
            };
            (current.number, given_up)
        };
        drop(given_up);
        number
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
            self.lease_lost();
        }
    }

    /// What a lost lease does to its holder: decided in [`ending::decide`].
    fn lease_lost(&self) {
        let mut current = self.holding.lock().expect("current holder");
        let turn = match ending::decide(current.entry(false, false), Event::LeaseLost) {
            Step::GiveUpTurn => current.turn.take(),
            _ => None,
        };
        drop(current);
        drop(turn);
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::engine::local::LocalTable;

    /// A lease the watchdog renews, held by holder 0 with the turn on key "k" of `table`,
    /// good for a minute.
    async fn held(table: &LocalTable<()>) -> LeaseState<()> {
        held_on(table, true).await
    }

    async fn held_on(table: &LocalTable<()>, renewed: bool) -> LeaseState<()> {
        let turn = table.turn(&key()).await;
        LeaseState::new(
            Some(turn),
            Instant::now() + Duration::from_secs(60),
            renewed,
        )
    }

    fn key() -> Arc<str> {
        "k".into()
    }

    /// Polls `waiting` once, so the task it stands for is queued for the key behind its
    /// holder, and returns it still waiting.
    async fn queue<F: Future + Unpin>(mut waiting: F) -> F {
        tokio::select! {
            biased;
            _ = &mut waiting => panic!("the key's turn is held"),
            () = std::future::ready(()) => waiting,
        }
    }

    #[tokio::test]
    async fn the_last_guard_carries_the_turn_to_a_waiting_task_only_while_budget_is_left() {
        let (table, k) = (LocalTable::default(), key());
        let lease_state = held(&table).await;
        assert_eq!(lease_state.release_guard(0, true).0, Step::ReleaseLast);
        drop(lease_state);

        let lease_state = held(&table).await;
        let waiting = queue(Box::pin(table.turn(&k))).await;
        let (step, turn) = lease_state.release_guard(0, false);
        assert_eq!((step, turn.is_some()), (Step::HandOverThroughRedis, false));
        assert!(
            lease_state.take_turn().is_some(),
            "the releaser keeps its turn"
        );
        drop((waiting, lease_state));

        let lease_state = held(&table).await;
        let _waiting = queue(Box::pin(table.turn(&k))).await;
        let (step, turn) = lease_state.release_guard(0, true);
        assert_eq!(step, Step::Carry);
        assert!(turn.is_some(), "the turn goes with the lock");
        assert!(lease_state.take_turn().is_none());
    }

    #[tokio::test]
    async fn a_fixed_or_lost_lease_is_released_in_redis_and_its_turn_given_up() {
        let (table, k) = (LocalTable::default(), key());
        let lease_state = held_on(&table, false).await;
        let _waiting = queue(Box::pin(table.turn(&k))).await;
        assert_eq!(lease_state.release_guard(0, true).0, Step::ReleaseLast);
        drop((lease_state, _waiting));

        let lease_state = held(&table).await;
        let _waiting = queue(Box::pin(table.turn(&k))).await;
        lease_state.fire("k", LostReason::Taken);
        assert!(
            lease_state.take_turn().is_none(),
            "a lost lease_state gives up its turn"
        );
        assert_eq!(lease_state.release_guard(0, true).0, Step::ReleaseLast);
    }

    #[tokio::test]
    async fn a_reentry_on_its_way_keeps_the_lock_and_counts_only_while_a_guard_lives() {
        let (table, k) = (LocalTable::default(), key());
        let lease_state = held(&table).await;
        let _waiting = queue(Box::pin(table.turn(&k))).await;
        lease_state.reentry_leaves(0);
        assert!(lease_state.reentry_back(0, true), "counted: a guard lives");
        assert_eq!(lease_state.release_guard(0, true).0, Step::ReleaseOne);

        lease_state.reentry_leaves(0);
        assert_eq!(
            lease_state.release_guard(0, true).0,
            Step::ReleaseLast,
            "not passed on while a re-entry is on its way"
        );
        assert!(
            !lease_state.reentry_back(0, true),
            "no guard is left to count it"
        );
        assert_eq!(lease_state.release_guard(0, true).0, Step::Nothing);
    }

    #[tokio::test]
    async fn a_holder_that_handed_the_lock_on_neither_releases_nor_gives_up_the_next_ones_turn() {
        let (table, k) = (LocalTable::default(), key());
        let lease_state = held(&table).await;
        let waiting = queue(Box::pin(table.turn(&k))).await;
        let (_, turn) = lease_state.release_guard(0, true);
        let next = lease_state.next_holder(turn.expect("carried"));
        assert_eq!(next, 1);
        lease_state.give_up_turn_of(0);
        assert_eq!(lease_state.release_guard(0, true).0, Step::Nothing);
        assert!(table.try_turn(&k).is_none(), "holder 1 keeps its turn");
        drop(waiting);
        assert_eq!(lease_state.release_guard(1, true).0, Step::ReleaseLast);
        lease_state.give_up_turn_of(1);
        assert!(table.try_turn(&k).is_some());
    }
}
