//! How long a lock lasts without its holder, and why a holder may be told it lost it: the
//! plain public types every layer of the crate shares.

use std::time::Duration;

/// The longest lease, wait or interval a client accepts: one year. Longer ones would only
/// overflow the clocks they are added to; a client refuses them with
/// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig).
pub const MAX_LEASE: Duration = Duration::from_secs(365 * 24 * 3600);

/// How long an acquired lock lasts without its holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Lease {
    /// Renewed by the client's watchdog while the guard lives (the default); the lock outlives
    /// a dead holder by at most the watchdog lease (30 s by default).
    #[default]
    Watchdog,
    /// Never renewed: the lock is released by Redis when this runs out, and the guard's lost
    /// signal fires. At least a millisecond and at most the client's
    /// [lease limit](crate::LockClientBuilder::lease_limit) (60 s by default): an
    /// acquisition on another fails with
    /// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) before anything is
    /// written.
    Fixed(Duration),
}

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
    /// Redis lost its data (a restart without persistence, a failover to an empty replica,
    /// a flush): every lock held there before is gone.
    DataLost,
}

impl Lease {
    /// Checks a fixed lease's length before it reaches Redis: from a millisecond to the
    /// client's lease limit, which a restart quarantine lasts.
    pub(crate) fn validate(self, limit: Duration) -> crate::Result<()> {
        match self {
            Lease::Fixed(lease) if lease < Duration::from_millis(1) || lease > limit => {
                Err(crate::LockError::new(
                    crate::ErrorKind::InvalidConfig,
                    format!(
                        "a fixed lease must be from 1 ms to the client's lease limit \
                         ({limit:?}, LockClientBuilder::lease_limit), not {lease:?}"
                    ),
                ))
            }
            _ => Ok(()),
        }
    }
}
