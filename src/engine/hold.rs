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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::engine::budget::Budget;
use crate::engine::ending::{self, Entry, Event, Step};
use crate::engine::giveback::{GiveBack, spawn_give_back};
use crate::engine::lease_state::LeaseState;
use crate::engine::shared::ClientState;
use crate::engine::waiter::Waiter;
use crate::error::Result;
use crate::keys::LockKeys;
use crate::lease::Lease;
use crate::meter::{self, HandoverPath, HoldMeter};
use crate::wire::scripts::{self, AcquireMode, AcquireReply, AcquireTerms, ReleaseScope};

/// What one task of a client leaves in the key's turn for the next task waiting on the same
/// key (the entry states [`Entry::Free`], [`Entry::Passing`] and [`Entry::Queued`]; while a
/// task holds the lock, the lease's local holder says the rest).
#[derive(Debug, Default)]
// Not boxed: a place passed on in the queue is the hand-over path between instances, and a
// box would allocate on it; the baton lives once per key in the local table.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Baton {
    /// Nothing: the next task goes to Redis.
    #[default]
    Free,
    /// The lock, still held in Redis.
    Passing(PassingHold),
    /// A place in the Redis queue, taken by the release that passed the lock on.
    Queued(Waiter),
}

impl Baton {
    /// The entry as [`ending::decide`] sees it.
    pub(crate) fn entry(&self) -> Entry {
        match self {
            Baton::Free => Entry::Free,
            Baton::Passing(passing) => Entry::Passing {
                usable: passing.usable(),
            },
            Baton::Queued(_) => Entry::Queued,
        }
    }
}

/// A hold on its way to the next local task. If nobody picks it up (every waiter left), it
/// is released in Redis when dropped.
#[derive(Debug)]
pub(crate) struct PassingHold {
    acquisition: Option<Arc<Acquisition>>,
    budget: Budget,
}

impl PassingHold {
    pub(crate) fn new(acquisition: Arc<Acquisition>, budget: Budget) -> Self {
        Self {
            acquisition: Some(acquisition),
            budget,
        }
    }

    /// Whether the next task can take it: its lease can be vouched for and a token of its
    /// block is left.
    fn usable(&self) -> bool {
        self.budget.has_tokens()
            && self
                .acquisition
                .as_ref()
                .is_some_and(|acquisition| acquisition.lease_state.is_live())
    }

    /// The hold, the next task's token and the rest of the budget, for the task that takes
    /// it over (see [`Step::TakeOver`]).
    pub(crate) fn take_over(mut self) -> Option<(Arc<Acquisition>, u64, Budget)> {
        let token = self.budget.take_token()?;
        let acquisition = self.acquisition.take()?;
        Some((acquisition, token, self.budget))
    }
}

/// Nobody took the hold over: it tells the entry, which gives it back.
impl Drop for PassingHold {
    fn drop(&mut self) {
        let entry = Entry::Passing {
            usable: self.usable(),
        };
        let Some(acquisition) = self.acquisition.take() else {
            return;
        };
        if let Step::GiveBack(_) = ending::decide(entry, Event::WaiterLeft) {
            acquisition.give_back_later(acquisition.owner.clone());
        }
    }
}

/// One acquisition of a lock in Redis, handed from local holder to local holder.
#[derive(Debug)]
pub(crate) struct Acquisition {
    pub(crate) shared: Arc<ClientState>,
    pub(crate) name: Arc<str>,
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) terms: AcquireTerms,
    pub(crate) owner: Arc<str>,
    pub(crate) lease_state: Arc<LeaseState<Baton>>,
    pub(crate) watchdog_id: u64,
    /// How the lease lasts: only a lease the watchdog renews is handed over locally.
    pub(crate) lease_mode: Lease,
    /// Which of the owner's holds belong to this acquisition, and so which its last release
    /// releases.
    pub(crate) holds: OwnerHolds,
    /// Of a write lock: the reads its owner takes within it. Made by the first.
    pub(crate) reads_within: OnceLock<Arc<ReadsWithin>>,
    /// Taken by a look that found nobody queued, not granted from the queue: others seldom
    /// queue for it later, so its last release goes out as plain commands first (see
    /// `plain_release.rs`); a lock granted from a queue is released by the script, which
    /// grants it on in the same call.
    pub(crate) taken_unqueued: bool,
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
impl Drop for Acquisition {
    fn drop(&mut self) {
        self.shared.watchdog.unregister(self.watchdog_id);
    }
}

impl Acquisition {
    /// The reads this write lock's owner takes within it.
    pub(crate) fn reads_within(&self) -> Arc<ReadsWithin> {
        self.reads_within.get_or_init(Arc::default).clone()
    }

    /// Whether the watchdog renews this acquisition's lease.
    pub(crate) fn renewed(&self) -> bool {
        self.lease_mode == Lease::Watchdog
    }

    /// Releases every hold of `owner` (this acquisition's, or the next task's queued place)
    /// in the background, retried while it could keep the lock from others. Out of the
    /// watchdog first: a lock given back on purpose is not reported lost.
    pub(crate) fn give_back_later(&self, owner: Arc<str>) {
        if owner == self.owner {
            self.shared.watchdog.unregister(self.watchdog_id);
        }
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
                let epoch = self.shared.watchdog.epoch().known_for(&self.keys);
                scripts::acquire(
                    &mut conn,
                    &self.keys,
                    self.shared.scope_keys(&self.keys),
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
                    self.shared.scope_keys(&self.keys),
                    &self.owner,
                    scope,
                )
                .await
            })
            .await
    }
}

/// One local holder of an acquisition: its guard and the guard's re-entries. How many of
/// them are left, and its turn on the key, the lease's local holder counts (see
/// [`LeaseState::release_guard`]).
#[derive(Debug)]
pub(crate) struct Holder {
    pub(crate) acquisition: Arc<Acquisition>,
    pub(crate) token: u64,
    pub(crate) budget: Budget,
    /// Its number among the lease's local holders (see [`LeaseState::next_holder`]).
    pub(crate) number: u64,
    /// How this holder got the lock from the holder before it, if it was handed over.
    pub(crate) handed_over: Option<HandoverPath>,
    /// Counts this hold as held until it ends.
    pub(crate) meter: HoldMeter,
}

impl Holder {
    /// A holder of `acquisition` with its first `token`; `handed_over` says how it got the
    /// lock when a holder before it gave it (`None`: taken from Redis as it found it), and
    /// `number` which of the lease's local holders it is.
    pub(crate) fn new(
        acquisition: Arc<Acquisition>,
        token: u64,
        budget: Budget,
        handed_over: Option<HandoverPath>,
        number: u64,
    ) -> Self {
        if let Some(path) = handed_over {
            meter::handed_over(path);
        }
        Self {
            token,
            budget,
            number,
            handed_over,
            meter: HoldMeter::start(acquisition.terms.kind),
            acquisition,
        }
    }
}

/// A holder that ends gives up its own turn on the key; a turn it handed on with the lock is
/// the next holder's, and stays.
impl Drop for Holder {
    fn drop(&mut self) {
        self.acquisition.lease_state.give_up_turn_of(self.number);
    }
}
