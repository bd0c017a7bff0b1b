//! The client's settings, and what they make of a lock's terms in Redis.

use std::time::Duration;

use crate::kind::LockKind;
use crate::lease::Lease;
use crate::wire::scripts::Terms;

/// The client's settings; every field has a documented default.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) prefix: String,
    pub(crate) watchdog_lease: Duration,
    pub(crate) renew_interval: Duration,
    pub(crate) repoll_interval: Duration,
    pub(crate) command_timeout: Duration,
    pub(crate) local_handoff_limit: u32,
    pub(crate) local_handoff_window: Duration,
    pub(crate) restart_quarantine: Duration,
}

impl Config {
    /// How long a waiter's place in a Redis queue lives without a refresh: three re-polls,
    /// so a live waiter never loses it and a dead one blocks nobody for longer.
    pub(crate) fn waiter_alive(&self) -> Duration {
        self.repoll_interval * 3
    }

    /// What a lock of `kind` held on `lease` asks of Redis: its lease, how long a queued place
    /// lives without a refresh, the lease of a hand-over from the queue, and the token block.
    pub(crate) fn terms(&self, lease: Lease, kind: LockKind) -> Terms {
        let alive_ms = millis(self.waiter_alive());
        match lease {
            Lease::Watchdog => {
                let lease_ms = millis(self.watchdog_lease);
                Terms {
                    lease_ms,
                    alive_ms,
                    // A waiter that died since its last refresh holds the lock this long at
                    // most; a live one's watchdog extends it at its next tick.
                    claim_ms: lease_ms.min(alive_ms),
                    // Tokens for the local hand-overs, which only an exclusive lock makes.
                    block: if kind.queues_locally() {
                        u64::from(self.local_handoff_limit) + 1
                    } else {
                        1
                    },
                    kind,
                }
            }
            Lease::Fixed(lease) => Terms {
                lease_ms: millis(lease),
                alive_ms,
                claim_ms: millis(lease),
                block: 1,
                kind,
            },
        }
    }
}

/// Whole milliseconds, at least one.
pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}
