//! What a holder gets: the guard, its fencing token and its lost signal.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{oneshot, watch};

use crate::client::Inner;
use crate::error::{ErrorKind, LockError, Result};
use crate::keys::LockKeys;
use crate::local::LocalTurn;
use crate::scripts::{self, ReleaseScope};

/// Why a lease was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// A fixed lease ran out.
    Expired,
    /// A renewal found the lock deleted or held by another owner.
    Taken,
    /// Redis could not be reached to renew the lease before it would have run out.
    Unreachable,
    /// The client was shut down and released the lock.
    ShutDown,
}

/// Shared by the guards of one holding and the watchdog: the lost signal, whether the holder
/// is releasing (a lock released on purpose is not reported lost), and this client's turn on
/// the key.
#[derive(Debug)]
pub(crate) struct LeaseState {
    lost: watch::Sender<Option<LostReason>>,
    closing: AtomicBool,
    /// Kept until the lock is released in Redis, so no task of this client overtakes the
    /// release; given up as soon as the lease is lost, so this client's other tasks compete
    /// for the lock again instead of queueing behind a guard that no longer holds it.
    turn: Mutex<Option<LocalTurn>>,
}

impl LeaseState {
    pub(crate) fn new(turn: LocalTurn) -> Self {
        Self {
            lost: watch::Sender::new(None),
            closing: AtomicBool::new(false),
            turn: Mutex::new(Some(turn)),
        }
    }

    fn give_up_turn(&self) {
        let turn = self.turn.lock().expect("local turn").take();
        drop(turn);
    }

    /// Fires the lost signal once, unless the holder is already releasing.
    pub(crate) fn fire(&self, lock: &str, reason: LostReason) {
        if self.closing.load(Ordering::SeqCst) {
            return;
        }
        let fired = self.lost.send_if_modified(|lost| {
            let first = lost.is_none();
            if first {
                *lost = Some(reason);
            }
            first
        });
        if fired {
            tracing::warn!(lock, ?reason, "lock lease lost");
            self.give_up_turn();
        }
    }

    fn signal(&self) -> LostSignal {
        LostSignal {
            lost: self.lost.subscribe(),
        }
    }
}

/// Tells a holder that its lease was lost: after that, another owner may hold the lock.
///
/// Cheap to clone; hand it to the code that works under the lock so it can stop in time.
#[derive(Debug, Clone)]
pub struct LostSignal {
    lost: watch::Receiver<Option<LostReason>>,
}

impl LostSignal {
    /// Whether the lease has been lost.
    pub fn is_lost(&self) -> bool {
        self.lost.borrow().is_some()
    }

    /// Why the lease was lost, if it was.
    pub fn reason(&self) -> Option<LostReason> {
        *self.lost.borrow()
    }

    /// Resolves when the lease is lost; never resolves for a lock that is released normally.
    pub async fn lost(&self) -> LostReason {
        let mut lost = self.lost.clone();
        // Copy the reason out so no borrow of the channel lives across an await.
        let reason = lost
            .wait_for(Option::is_some)
            .await
            .ok()
            .and_then(|reason| *reason);
        match reason {
            Some(reason) => reason,
            None => std::future::pending().await,
        }
    }
}

/// One acquisition of a lock by one owner, shared by the guard and its re-entries.
#[derive(Debug)]
pub(crate) struct Holding {
    pub(crate) inner: Arc<Inner>,
    pub(crate) name: Arc<str>,
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) owner: Arc<str>,
    pub(crate) token: u64,
    pub(crate) lease: Arc<LeaseState>,
    pub(crate) watchdog_id: u64,
    /// Guards of this holding not yet released.
    pub(crate) holds: AtomicUsize,
}

impl Drop for Holding {
    fn drop(&mut self) {
        self.inner.watchdog.unregister(self.watchdog_id);
        self.lease.give_up_turn();
    }
}

/// Proof of holding a lock. Release it with [`LockGuard::release`] to see the result;
/// dropping it releases in the background and never blocks.
///
/// Ownership belongs to the guard, not to a thread or task: it may move between tasks, and
/// [`LockGuard::reenter`] adds a hold for code that needs the same lock again.
#[derive(Debug)]
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    holding: Arc<Holding>,
    released: bool,
}

impl LockGuard {
    pub(crate) fn new(holding: Holding) -> Self {
        Self {
            holding: Arc::new(holding),
            released: false,
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.holding.name
    }

    /// The fencing token of this acquisition: it only grows per lock name, across every
    /// client. Pass it to the resource you protect and let it refuse older tokens. A
    /// re-entry shares the token of the acquisition it re-enters.
    pub fn fencing_token(&self) -> u64 {
        self.holding.token
    }

    /// The owner id stored in Redis for this acquisition (client instance id and holder id).
    pub fn owner_id(&self) -> &str {
        &self.holding.owner
    }

    /// A signal that fires if the lease is lost while this guard is held.
    pub fn lost_signal(&self) -> LostSignal {
        self.holding.lease.signal()
    }

    /// Whether this guard still holds the lock, as far as this process knows: not released
    /// and no lost lease reported.
    pub fn is_held(&self) -> bool {
        !self.released && self.holding.lease.lost.borrow().is_none()
    }

    /// Takes the lock once more for the same owner: the hold count in Redis goes up, and the
    /// lock is freed only when every guard is released. The lease is not changed.
    ///
    /// Cancelling the call is safe: a hold Redis granted after the caller left is released
    /// again. Only when the connection breaks mid-call is the outcome unknown; a hold counted
    /// then keeps the lock until its lease runs out after the last guard is released.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::NotOwner`] when the lock is no longer held by this owner,
    /// [`ErrorKind::RedisUnavailable`] or [`ErrorKind::Redis`] when Redis fails, and
    /// [`ErrorKind::ShutDown`] after shutdown.
    pub async fn reenter(&self) -> Result<LockGuard> {
        let holding = self.holding.clone();
        holding.inner.ensure_running()?;
        let (deliver, delivered) = oneshot::channel();
        // The script runs in its own task so that a hold granted to a caller who has left is
        // handed to a guard that is dropped, which releases it.
        holding.inner.runtime.clone().spawn(async move {
            let reply = holding
                .inner
                .connections
                .run(|mut conn| {
                    let holding = holding.clone();
                    async move {
                        scripts::acquire(&mut conn, &holding.keys, &holding.owner, 0, true).await
                    }
                })
                .await;
            let outcome = match reply {
                Ok(scripts::AcquireReply::Acquired(_)) => {
                    if holding.holds.fetch_add(1, Ordering::SeqCst) == 0 {
                        // A concurrent release of the other guards lost the race to this hold.
                        holding.lease.closing.store(false, Ordering::SeqCst);
                    }
                    Ok(LockGuard {
                        holding,
                        released: false,
                    })
                }
                Ok(_) => Err(LockError::new(
                    ErrorKind::NotOwner,
                    "the lock is no longer held by this owner",
                )),
                Err(err) => Err(err),
            };
            let _ = deliver.send(outcome);
        });
        delivered
            .await
            .unwrap_or_else(|_| Err(LockError::shut_down()))
    }

    /// Releases this hold and waits for Redis to confirm. The last hold deletes the lock and
    /// wakes its waiters.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::NotOwner`] when the lock was no longer held (its lease was lost or it was
    /// force-unlocked), [`ErrorKind::RedisUnavailable`] when Redis could not be reached (the
    /// lease then runs out on its own, as the watchdog stops renewing it), and
    /// [`ErrorKind::ShutDown`] after shutdown.
    pub async fn release(mut self) -> Result<()> {
        self.released = true;
        release_hold(self.holding.clone()).await
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let holding = self.holding.clone();
        let runtime = holding.inner.runtime.clone();
        runtime.spawn(async move {
            let name = holding.name.clone();
            if let Err(err) = release_hold(holding).await {
                tracing::debug!(lock = %name, error = %err, "background release failed");
            }
        });
    }
}

async fn release_hold(holding: Arc<Holding>) -> Result<()> {
    if holding.holds.fetch_sub(1, Ordering::SeqCst) == 1 {
        holding.lease.closing.store(true, Ordering::SeqCst);
    }
    let released = holding
        .inner
        .connections
        .run(|mut conn| {
            let holding = holding.clone();
            async move {
                scripts::release(&mut conn, &holding.keys, &holding.owner, ReleaseScope::One).await
            }
        })
        .await?;
    match released {
        Some(_) => Ok(()),
        None => Err(LockError::new(
            ErrorKind::NotOwner,
            "the lock was no longer held by this guard (lease lost or force-unlocked)",
        )),
    }
}
