//! What one acquisition of a lock in Redis is, and what passes it from one local holder to
//! the next. The local hand-over is lock cohorting (Dice, Marathe and Shavit, "Lock
//! Cohorting", PPoPP 2012): a lock held in Redis passes from one task of this client to the
//! next that waits for it, without a Redis round trip, within a fairness budget; past the
//! budget it goes back through Redis, so other instances get their turn.
//!
//! Correctness of what a successor gets:
//! - **Fencing tokens.** Every Redis acquisition reserves a block of tokens (one plus the
//!   hand-overs allowed) in its script; each local successor takes the next token of the
//!   block, in the order the critical sections start, and the next Redis acquisition anywhere
//!   reserves a block above it. Tokens keep growing strictly per lock.
//! - **The lost signal.** The lease belongs to the Redis acquisition, and successors share
//!   it: a hold is only handed over while its lease is not reported lost, a successor checks
//!   again when it picks it up, and a loss after that fires the signal the successor holds.
//! - Only watchdog-mode leases are handed over: a fixed lease belongs to one holder.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use crate::engine::giveback::{GiveBack, spawn_give_back};
use crate::engine::lease_state::LeaseState;
use crate::engine::shared::ClientState;
use crate::engine::waiter::Waiter;
use crate::error::Result;
use crate::keys::LockKeys;
use crate::lease::Lease;
use crate::meter::{self, HandoverPath, HoldMeter};
use crate::wire::scripts::{self, AcquireMode, AcquireReply, AcquireTerms, ReleaseScope};

/// What one task of a client leaves for the next task waiting on the same key.
#[derive(Debug, Default)]
// Not boxed: a place passed on in the queue is the hand-over path between instances, and a
// box would allocate on it; the baton lives once per key in the local table.
#[allow(clippy::large_enum_variant)]
pub(crate) enum PassedOn {
    /// Nothing: the next task goes to Redis.
    #[default]
    Free,
    /// The lock, still held in Redis.
    Held(PassingHold),
    /// A place in the Redis queue, taken by the release that passed the lock on.
    Queued(Waiter),
}

/// What is left of the fairness budget of one Redis acquisition.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Budget {
    next_token: u64,
    tokens_left: u64,
    until: Instant,
}

impl Budget {
    /// The budget of an acquisition whose token block starts at `first_token`; the first
    /// token is the acquirer's own.
    pub(crate) fn new(first_token: u64, block: u64, window: Duration) -> Self {
        Self::reserved(first_token + 1, block.saturating_sub(1), window)
    }

    /// The budget of a block of `block` tokens from `first_token` that nobody holds yet: the
    /// first is the next holder's (a lock a hand-over through Redis kept for this client).
    pub(crate) fn reserved(first_token: u64, block: u64, window: Duration) -> Self {
        Self {
            next_token: first_token,
            tokens_left: block,
            until: Instant::now() + window,
        }
    }

    pub(crate) fn allows_handover(&self) -> bool {
        self.allows_handover_at(Instant::now())
    }

    /// Whether a token is left and `now` is within the window.
    fn allows_handover_at(&self, now: Instant) -> bool {
        self.tokens_left > 0 && now < self.until
    }

    /// The next token of the block; `None` once the block is spent.
    fn take_token(&mut self) -> Option<u64> {
        self.tokens_left = self.tokens_left.checked_sub(1)?;
        let token = self.next_token;
        self.next_token += 1;
        Some(token)
    }
}

/// A hold on its way to the next local task. If nobody picks it up (every waiter left), it
/// is released in Redis when dropped.
#[derive(Debug)]
pub(crate) struct PassingHold {
    acquisition: Option<Arc<RedisHold>>,
    budget: Budget,
}

impl PassingHold {
    pub(crate) fn new(acquisition: Arc<RedisHold>, budget: Budget) -> Self {
        Self {
            acquisition: Some(acquisition),
            budget,
        }
    }

    /// The hold and the successor's token, if the successor wants a watchdog lease, the
    /// lease is intact and within its deadline, and a token is left; otherwise the hold is
    /// released in the background.
    pub(crate) fn pick_up(mut self, wants_watchdog: bool) -> Option<(Arc<RedisHold>, u64, Budget)> {
        let usable = self
            .acquisition
            .as_ref()
            .is_some_and(|acquisition| wants_watchdog && acquisition.lease.is_live());
        if !usable {
            return None;
        }
        let token = self.budget.take_token()?;
        let acquisition = self.acquisition.take()?;
        Some((acquisition, token, self.budget))
    }
}

impl Drop for PassingHold {
    fn drop(&mut self) {
        let Some(acquisition) = self.acquisition.take() else {
            return;
        };
        acquisition
            .shared
            .watchdog
            .unregister(acquisition.watchdog_id);
        // Released in the background, retried on fresh connections while the hold could
        // still keep the lock, as any release nobody waits for.
        acquisition.give_back_later(acquisition.owner.clone());
    }
}

/// One acquisition of a lock in Redis, handed from local holder to local holder.
#[derive(Debug)]
pub(crate) struct RedisHold {
    pub(crate) shared: Arc<ClientState>,
    pub(crate) name: Arc<str>,
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) terms: AcquireTerms,
    pub(crate) owner: Arc<str>,
    pub(crate) lease: Arc<LeaseState<PassedOn>>,
    pub(crate) watchdog_id: u64,
    /// How the lease lasts: only a lease the watchdog renews is handed over locally.
    pub(crate) lease_mode: Lease,
    /// Which of the owner's holds belong to this acquisition, and so which its last release
    /// releases.
    pub(crate) holds: OwnerHolds,
    /// Of a write lock: the reads its owner takes within it. Made by the first.
    pub(crate) reads_within: OnceLock<Arc<ReadsWithin>>,
}

/// Which of its owner's holds in Redis an acquisition answers for.
#[derive(Debug, Clone)]
pub(crate) enum OwnerHolds {
    /// Every one, so its last release releases them all (a hold Redis counted whose reply
    /// was lost included).
    Every,
    /// Only its own: a read within a write lock, whose owner's other read holds are other
    /// acquisitions' (all of this client, counted together).
    OnlyItsOwn(Arc<ReadsWithin>),
}

impl OwnerHolds {
    /// What a release of one of the acquisition's holds releases in Redis: the `last`, or
    /// one while another guard of the acquisition still holds it.
    pub(crate) fn release(&self, last: bool) -> ReleaseScope {
        match self {
            OwnerHolds::Every if last => ReleaseScope::All,
            OwnerHolds::Every => ReleaseScope::Partial,
            OwnerHolds::OnlyItsOwn(reads) => ReleaseScope::OneWithin {
                keep: reads.released(),
            },
        }
    }

    /// What a give-back releases: every hold, or the reads within that no guard needs.
    pub(crate) fn give_back(&self) -> ReleaseScope {
        match self {
            OwnerHolds::Every => ReleaseScope::All,
            OwnerHolds::OnlyItsOwn(reads) => ReleaseScope::OneWithin {
                keep: reads.needed(),
            },
        }
    }

    /// One more hold is asked of Redis (a re-entry): counted before it is sent, so that no
    /// release meanwhile lets Redis drop it.
    pub(crate) fn asking(&self) {
        if let OwnerHolds::OnlyItsOwn(reads) = self {
            reads.asking();
        }
    }

    /// A hold asked for with [`Self::asking`] was not granted (or not kept).
    pub(crate) fn not_granted(&self) {
        if let OwnerHolds::OnlyItsOwn(reads) = self {
            reads.released();
        }
    }
}

/// The read holds within one write lock that this client's guards have or are asking for.
/// Redis counts them together under the owner, and a release sent twice would take two:
/// every release within says how many must stay (see `lua/rw_release.lua`).
#[derive(Debug, Default)]
pub(crate) struct ReadsWithin(AtomicU64);

impl ReadsWithin {
    /// One more is asked for, before its script is sent.
    pub(crate) fn asking(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }

    /// One less: returns how many are still needed.
    pub(crate) fn released(&self) -> u64 {
        self.0.fetch_sub(1, Ordering::SeqCst).saturating_sub(1)
    }

    /// How many are needed now.
    pub(crate) fn needed(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// The watchdog renews a lease for as long as its Redis hold lives: until the last local
/// holder it was handed to ends, or the hold on its way to one is dropped. A release on
/// purpose takes it out of the watchdog earlier, so it is not reported lost.
impl Drop for RedisHold {
    fn drop(&mut self) {
        self.shared.watchdog.unregister(self.watchdog_id);
    }
}

impl RedisHold {
    /// The reads this write lock's owner takes within it.
    pub(crate) fn reads_within(&self) -> Arc<ReadsWithin> {
        self.reads_within.get_or_init(Arc::default).clone()
    }

    /// Whether the watchdog renews this acquisition's lease.
    pub(crate) fn renewed(&self) -> bool {
        self.lease_mode == Lease::Watchdog
    }

    /// Releases every hold of `owner` (this acquisition's, or the next task's queued place)
    /// in the background, retried while it could keep the lock from others.
    pub(crate) fn give_back_later(&self, owner: Arc<str>) {
        let give_back = GiveBack {
            keys: self.keys.clone(),
            kind: self.terms.kind,
            owner,
            scope: self.holds.give_back(),
            conn: None,
            within: Duration::from_millis(self.terms.lease_ms),
        };
        spawn_give_back(self.shared.clone(), give_back);
    }

    /// Runs the acquire script for this acquisition's owner on `terms`: a re-entry, or a read
    /// within its write lock.
    pub(crate) async fn acquire_in_redis(
        &self,
        terms: &AcquireTerms,
        mode: AcquireMode,
    ) -> Result<AcquireReply> {
        self.shared
            .connections
            .run(self.keys.hash(), |mut conn| async move {
                let epoch = self.shared.watchdog.epoch().terms_for(&self.keys);
                scripts::acquire(
                    &mut conn,
                    &self.keys,
                    self.shared.names(&self.keys),
                    &self.owner,
                    terms,
                    mode,
                    &epoch,
                )
                .await
            })
            .await
    }

    /// Runs the release script for this acquisition's owner: one hold, or all of them. Returns the
    /// holds left, or `None` when the owner held nothing.
    pub(crate) async fn run_release_script(&self, scope: ReleaseScope) -> Result<Option<u64>> {
        self.shared
            .connections
            .run(self.keys.hash(), |mut conn| async move {
                scripts::release(
                    &mut conn,
                    &self.keys,
                    self.terms.kind,
                    self.shared.names(&self.keys),
                    &self.owner,
                    scope,
                )
                .await
            })
            .await
    }
}

/// One local holder of an acquisition: its guard and the guard's re-entries.
#[derive(Debug)]
pub(crate) struct TaskHold {
    pub(crate) acquisition: Arc<RedisHold>,
    pub(crate) token: u64,
    pub(crate) budget: Budget,
    /// Guards of this holder not yet released.
    pub(crate) holds: AtomicUsize,
    /// Re-entries on their way to Redis; the lock is not handed over meanwhile.
    pub(crate) reentering: AtomicUsize,
    /// Its number among the lease's local holders, by which it gives up its own turn on the
    /// key when it ends (`None`: it was given no turn).
    turn_of: Option<u64>,
    /// How this holder got the lock from the holder before it, if it was handed over.
    pub(crate) handed_over: Option<HandoverPath>,
    /// Counts this hold as held until it ends.
    _meter: HoldMeter,
}

impl TaskHold {
    /// A holder of `acquisition` with its first `token`; `handed_over` says how it got the
    /// lock when a holder before it gave it (`None`: taken from Redis as it found it), and
    /// `turn_of` its number among the lease's local holders (see `LeaseState::put_turn`).
    pub(crate) fn new(
        acquisition: Arc<RedisHold>,
        token: u64,
        budget: Budget,
        handed_over: Option<HandoverPath>,
        turn_of: Option<u64>,
    ) -> Self {
        if let Some(path) = handed_over {
            meter::handed_over(path);
        }
        Self {
            token,
            budget,
            holds: AtomicUsize::new(1),
            reentering: AtomicUsize::new(0),
            turn_of,
            handed_over,
            _meter: HoldMeter::start(acquisition.terms.kind),
            acquisition,
        }
    }
}

/// A holder that ends gives up its own turn on the key; a turn it handed on with the lock is
/// the next holder's, and stays.
impl Drop for TaskHold {
    fn drop(&mut self) {
        if let Some(holder) = self.turn_of {
            self.acquisition.lease.give_up_turn_of(holder);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Time is given, not slept: the budget is read at chosen instants.
    #[test]
    fn a_budget_hands_out_its_block_in_order_within_its_window() {
        let window = Duration::from_millis(25);
        let start = Instant::now();
        // An acquisition's own token is the block's first; the rest go to local successors.
        let mut budget = Budget::new(100, 3, window);
        assert!(budget.allows_handover_at(start));
        assert_eq!(budget.take_token(), Some(101));
        assert_eq!(budget.take_token(), Some(102));
        assert!(!budget.allows_handover_at(start), "the block is spent");
        assert_eq!(budget.take_token(), None);

        let budget = Budget::new(200, 17, window);
        assert!(budget.allows_handover_at(start + window / 2));
        let past = start + window + Duration::from_millis(1);
        assert!(
            !budget.allows_handover_at(past),
            "past the window, whatever tokens are left"
        );
    }

    #[test]
    fn a_block_kept_by_a_hand_over_through_redis_starts_with_the_next_holders_token() {
        // A limit of 0 reserves a block of one: the next task's own, and no more.
        let mut budget = Budget::reserved(300, 1, Duration::from_millis(25));
        assert_eq!(budget.take_token(), Some(300));
        assert_eq!(budget.take_token(), None);
        assert!(!budget.allows_handover());
    }
}
