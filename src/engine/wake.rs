//! The wake table: which owners of this client wait in a Redis queue, and the slot through
//! which each hears of its grant. The listeners (`pubsub.rs` on one server, `sharded.rs` on a
//! cluster) fill it from the wake messages; waiters read their own slot.
//!
//! A waiter registers its owner id (no await, no round trip) before it joins a queue in
//! Redis, so no grant can arrive unheard. A wake message reads
//! `<owner id> <fencing token> <server ms> <lease ms>`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{Instant, sleep_until, timeout};

/// A lock handed to a waiter by a release, as announced on the wake channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grant {
    /// The first fencing token of the block reserved for the waiter.
    pub(crate) token: u64,
    /// The server's clock when the lock was handed over.
    pub(crate) server_ms: u64,
    /// The lease it was handed over with (the waiter's watchdog extends it).
    pub(crate) lease_ms: u64,
    /// The tokens reserved from `token` on: the waiter's own and those of its local
    /// hand-overs (fewer than it asked for when the scope's counter ran ahead).
    pub(crate) reserved: u64,
}

/// What a waiter sees of its slot.
#[derive(Debug, Clone, Copy, Default)]
struct Wake {
    /// Bumped on every (re)subscription and on shutdown: look at the lock again.
    wakeups: u64,
    grant: Option<Grant>,
}

/// Every waiting owner of this client and its slot.
#[derive(Debug, Clone, Default)]
pub(crate) struct WakeTable {
    slots: Arc<Mutex<HashMap<Arc<str>, watch::Sender<Wake>>>>,
}

/// What a waiter on a cluster holds while it waits in a queue: its share of the
/// subscription to its slot's channel, given up when dropped.
pub(crate) trait Listening: Send + Sync + std::fmt::Debug {
    /// Resolves once the server confirmed the subscription.
    fn ready(&self) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}

impl WakeTable {
    /// Registers `owner`, so a grant to it reaches the returned slot.
    pub(crate) fn register(&self, owner: Arc<str>) -> WakeSlot {
        let (sender, wake) = watch::channel(Wake::default());
        self.slots
            .lock()
            .expect("wake slots")
            .insert(owner.clone(), sender);
        WakeSlot {
            table: self.clone(),
            owner,
            wake,
            delivered: None,
        }
    }

    /// Wakes every waiter: grants may have been missed, and their next look finds them.
    pub(crate) fn wake_all(&self) {
        for slot in self.slots.lock().expect("wake slots").values() {
            slot.send_modify(|wake| wake.wakeups += 1);
        }
    }

    /// Passes the grant of a wake message to the waiter it names; grants to owners that
    /// stopped waiting are ignored, because their undo releases them.
    pub(crate) fn deliver(&self, channel: &str, payload: &[u8]) {
        let Some((owner, grant)) = parse_grant(payload) else {
            tracing::warn!(channel, "unreadable wake message");
            return;
        };
        if let Some(slot) = self.slots.lock().expect("wake slots").get(owner) {
            slot.send_modify(|wake| wake.grant = Some(grant));
        }
    }

    /// How many owners of this client wait in a Redis queue right now.
    pub(crate) fn waiting(&self) -> usize {
        self.slots.lock().expect("wake slots").len()
    }
}

/// One waiting owner's slot; dropping it forgets the owner.
#[derive(Debug)]
pub(crate) struct WakeSlot {
    table: WakeTable,
    owner: Arc<str>,
    wake: watch::Receiver<Wake>,
    /// The grant already returned: it is returned once, so a waiter that found it stale and
    /// looked again is never handed it a second time.
    delivered: Option<Grant>,
}

impl WakeSlot {
    /// Marks every wake-up so far as seen; call before each look at the lock.
    pub(crate) fn mark_seen(&mut self) {
        self.wake.borrow_and_update();
    }

    /// Sleeps until the lock is granted to this owner (a grant not returned before), or a
    /// wake-up not yet seen, or `bound` (`None`).
    pub(crate) async fn wait(&mut self, bound: Duration) -> Option<Grant> {
        let pending = self.wake.borrow().grant;
        if let Some(grant) = self.fresh(pending) {
            return Some(grant);
        }
        let deadline = Instant::now() + bound;
        match timeout(bound, self.wake.changed()).await {
            Ok(Ok(())) => {
                let granted = self.wake.borrow_and_update().grant;
                self.fresh(granted)
            }
            Ok(Err(_)) => {
                // The sender is gone (only if the table was torn down): poll instead.
                sleep_until(deadline).await;
                None
            }
            Err(_) => None,
        }
    }

    /// `grant`, unless it was returned before.
    fn fresh(&mut self, grant: Option<Grant>) -> Option<Grant> {
        if grant.is_none() || grant == self.delivered {
            return None;
        }
        self.delivered = grant;
        grant
    }
}

impl Drop for WakeSlot {
    fn drop(&mut self) {
        self.table
            .slots
            .lock()
            .expect("wake slots")
            .remove(&self.owner);
    }
}

/// Reads `<owner id> <token> <server ms> <lease ms> <tokens reserved>`. A message without
/// the count (from an earlier version) reserved at least the grant's own token, and no more
/// is assumed.
fn parse_grant(payload: &[u8]) -> Option<(&str, Grant)> {
    let text = std::str::from_utf8(payload).ok()?;
    let mut parts = text.split(' ');
    let owner = parts.next()?;
    let token = parts.next()?.parse().ok()?;
    let server_ms = parts.next()?.parse().ok()?;
    let lease_ms = parts.next()?.parse().ok()?;
    let reserved = match parts.next() {
        Some(count) => count.parse().ok()?,
        None => 1,
    };
    Some((
        owner,
        Grant {
            token,
            server_ms,
            lease_ms,
            reserved,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_are_read_from_the_wake_message() {
        let (owner, grant) = parse_grant(b"ab12:7 1763682600000001 1763682600000 2500 17").unwrap();
        assert_eq!(owner, "ab12:7");
        assert_eq!(
            grant,
            Grant {
                token: 1_763_682_600_000_001,
                server_ms: 1_763_682_600_000,
                lease_ms: 2500,
                reserved: 17,
            }
        );
        let (_, earlier) = parse_grant(b"ab12:7 1763682600000001 1763682600000 2500").unwrap();
        assert_eq!(earlier.reserved, 1, "no hand-over token is assumed");
        assert!(parse_grant(b"ab12:7 1 1 1 x").is_none());
        assert!(parse_grant(b"ab12:7 x 1 1").is_none());
        assert!(parse_grant(b"ab12:7 1 1").is_none());
        assert!(parse_grant(b"ab12:7").is_none());
    }
}
