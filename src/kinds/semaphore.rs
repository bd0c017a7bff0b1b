//! The semaphore: a name with N permits, held by any number of holders whose permits add up
//! to no more than N, across every instance. Redisson's `RSemaphore` with
//! `RPermitExpirableSemaphore`'s leases, and none of their leaks: every acquisition is an
//! owner with its own lease (watchdog-renewed or fixed), lost signal and fencing token, so a
//! holder that dies gives its permits back when its lease runs out.
//!
//! The state lives in the semaphore's own hash (see `wire/lua/lib/semaphore.lua`); the scripts are
//! `wire/lua/sem_acquire.lua` and `wire/lua/sem_release.lua`.

use std::time::Duration;

use crate::client::LockClient;
use crate::error::{ErrorKind, LockError, Result};
use crate::guard::{LockGuard, LostSignal};
use crate::keys::display_name;
use crate::lease::Lease;
use crate::lock::Lock;
use crate::lock_kind::LockKind;

/// A distributed semaphore: `permits` permits shared by every client of the name.
///
/// - **Leases, not leaks.** Each acquisition holds its permits on a lease of its own,
///   renewed by the watchdog (or [fixed](Self::with_lease)); a holder that dies frees them
///   when that lease runs out, whatever the other holders do.
/// - **The count lives in Redis.** The permit count is stored with the semaphore while
///   anyone holds it. A client that asks with another count gets
///   [`ErrorKind::PermitsMismatch`] and takes nothing: two configurations never silently
///   mix. Once nobody holds the semaphore, nothing of it is left in Redis, and the next
///   acquisition's count stands; so a count changes with a deploy once the old holders are
///   done, or at once under a new name.
/// - **Fair, with no herd.** Waiters queue in Redis in the order they asked, with liveness.
///   A release hands the freed permits to the waiters at the head of the queue while each
///   fits, in order, and tells only those; the first that does not fit stops the hand-out,
///   so a waiter for many permits is never starved by a stream of waiters for few. A new
///   acquisition never overtakes a live waiter.
/// - Every acquisition gets a fencing token, growing across all of the semaphore's holders.
///
/// A semaphore's keys are its own (`<prefix>{<name>}:semaphore`, in the slot of the lock of
/// the same name): a lock and a semaphore of one name are unrelated.
#[derive(Debug, Clone)]
pub struct Semaphore {
    /// Taken as one permit; [`Lock::of_kind`] makes the handles for more.
    one: Lock,
    permits: u32,
}

impl Semaphore {
    /// The semaphore's name.
    pub fn name(&self) -> &str {
        self.one.name()
    }

    /// How many permits it has.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The same semaphore, its permits held on `lease` (default [`Lease::Watchdog`]).
    #[must_use]
    pub fn with_lease(mut self, lease: Lease) -> Self {
        self.one = self.one.with_lease(lease);
        self
    }

    /// The handle that takes `take` permits.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidConfig`] unless `1 <= take <= permits`.
    fn taking(&self, take: u32) -> Result<Lock> {
        if take == 0 || take > self.permits {
            return Err(LockError::new(
                ErrorKind::InvalidConfig,
                format!(
                    "cannot take {take} of semaphore '{}''s {} permits",
                    display_name(self.name()),
                    self.permits
                ),
            ));
        }
        Ok(self.one.of_kind(LockKind::Semaphore {
            permits: self.permits,
            take,
        }))
    }

    /// Waits until one permit is acquired, however long that takes.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future leaves nothing held or queued (permits Redis granted
    /// meanwhile are given back in the background).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::PermitsMismatch`] when Redis holds the semaphore with another permit
    /// count, and the errors of [`Lock::acquire`].
    pub async fn acquire(&self) -> Result<PermitGuard> {
        self.acquire_many(1).await
    }

    /// Waits until `take` permits are acquired together.
    ///
    /// # Cancel safety
    ///
    /// As [`Semaphore::acquire`].
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidConfig`] unless `1 <= take <= permits` (before anything is
    /// written), and the errors of [`Semaphore::acquire`].
    pub async fn acquire_many(&self, take: u32) -> Result<PermitGuard> {
        let guard = self.taking(take)?.acquire().await?;
        Ok(PermitGuard::new(guard, take))
    }

    /// Waits at most `wait` for one permit.
    ///
    /// # Cancel safety
    ///
    /// As [`Semaphore::acquire`].
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Timeout`] when `wait` passes first, and the errors of
    /// [`Semaphore::acquire`].
    pub async fn acquire_timeout(&self, wait: Duration) -> Result<PermitGuard> {
        self.acquire_many_timeout(1, wait).await
    }

    /// Waits at most `wait` for `take` permits together.
    ///
    /// # Cancel safety
    ///
    /// As [`Semaphore::acquire`].
    ///
    /// # Errors
    ///
    /// As [`Semaphore::acquire_many`] and [`Semaphore::acquire_timeout`].
    pub async fn acquire_many_timeout(&self, take: u32, wait: Duration) -> Result<PermitGuard> {
        let guard = self.taking(take)?.acquire_timeout(wait).await?;
        Ok(PermitGuard::new(guard, take))
    }

    /// Takes one permit if one is free now and nobody waits; `Ok(None)` otherwise.
    ///
    /// # Cancel safety
    ///
    /// As [`Semaphore::acquire`].
    ///
    /// # Errors
    ///
    /// The errors of [`Semaphore::acquire`].
    pub async fn try_acquire(&self) -> Result<Option<PermitGuard>> {
        self.try_acquire_many(1).await
    }

    /// Takes `take` permits if that many are free now and nobody waits; `Ok(None)` otherwise.
    ///
    /// # Cancel safety
    ///
    /// As [`Semaphore::acquire`].
    ///
    /// # Errors
    ///
    /// The errors of [`Semaphore::acquire_many`].
    pub async fn try_acquire_many(&self, take: u32) -> Result<Option<PermitGuard>> {
        let guard = self.taking(take)?.try_acquire().await?;
        Ok(guard.map(|guard| PermitGuard::new(guard, take)))
    }

    /// Removes every holder, whoever they are, and hands the permits to the queue; for
    /// operators. The holders learn of it at their next renewal (their lost signals fire).
    /// Returns whether anyone held a permit.
    ///
    /// # Cancel safety
    ///
    /// Once sent, the script runs whether or not the caller waits for its answer.
    ///
    /// # Errors
    ///
    /// As [`Lock::force_unlock`].
    pub async fn force_unlock(&self) -> Result<bool> {
        self.one.force_unlock().await
    }
}

/// Proof of holding permits of a [`Semaphore`]. Release it with [`PermitGuard::release`] to
/// see the result; dropping it releases in the background and never blocks.
#[derive(Debug)]
#[must_use = "dropping the guard releases the permits at once"]
pub struct PermitGuard {
    guard: LockGuard,
    permits: u32,
}

impl PermitGuard {
    fn new(guard: LockGuard, permits: u32) -> Self {
        Self { guard, permits }
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        self.guard.name()
    }

    /// How many permits this guard holds.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The fencing token of this acquisition: above every token any holder of the semaphore
    /// got before it.
    pub fn fencing_token(&self) -> u64 {
        self.guard.fencing_token()
    }

    /// The owner id Redis knows this holder by.
    pub fn owner_id(&self) -> &str {
        self.guard.owner_id()
    }

    /// Fires when the lease on these permits is lost (see [`LockGuard::lost_signal`]).
    pub fn lost_signal(&self) -> LostSignal {
        self.guard.lost_signal()
    }

    /// Whether the permits are still held, as far as this client knows.
    pub fn is_held(&self) -> bool {
        self.guard.is_held()
    }

    /// Gives the permits back; the waiters at the head of the queue that now fit get them.
    ///
    /// # Errors
    ///
    /// As [`LockGuard::release`].
    pub async fn release(self) -> Result<()> {
        self.guard.release().await
    }
}

impl LockClient {
    /// The semaphore called `name`, with `permits` permits (see [`Semaphore`]).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidName`] for a bad name (as [`LockClient::lock`]), and
    /// [`ErrorKind::InvalidConfig`] for zero permits.
    pub fn semaphore(&self, name: &str, permits: u32) -> Result<Semaphore> {
        if permits == 0 {
            return Err(LockError::new(
                ErrorKind::InvalidConfig,
                format!(
                    "semaphore '{}' needs at least one permit",
                    display_name(name)
                ),
            ));
        }
        let one = self.semaphore_of_kind(name, LockKind::Semaphore { permits, take: 1 })?;
        Ok(Semaphore { one, permits })
    }
}
