//! How long a lock lasts without its holder, and why a holder may be told it lost it: the
//! plain public types every layer of the crate shares.

use std::time::Duration;

/// How long an acquired lock lasts without its holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Lease {
    /// Renewed by the client's watchdog while the guard lives (the default); the lock outlives
    /// a dead holder by at most the watchdog lease (30 s by default).
    #[default]
    Watchdog,
    /// Never renewed: the lock is released by Redis when this runs out, and the guard's lost
    /// signal fires.
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
