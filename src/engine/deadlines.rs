//! The watchdog's table of leases by deadline: when each holder must be told its lease is
//! lost unless a renewal succeeds first. A `BTreeSet` of `(deadline, id)` keeps them in the
//! order they fall due, so the actor visits only the due ones and sleeps towards the first.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::keys::LockKeys;
use crate::lease::{Lease, LostReason};
use crate::lock_kind::LockKind;

/// What the watchdog sees of a lease: it moves the deadline on at each renewal and tells the
/// holders when it can no longer vouch for the lease.
pub(crate) trait Watched: Send + Sync + std::fmt::Debug {
    /// Fires the lost signal, once.
    fn fire(&self, lock: &str, reason: LostReason);
    /// The holder must be told the lease is lost at `deadline` unless renewed before.
    fn extend_to(&self, deadline: Instant);
}

/// One held lock, as the watchdog tracks it.
#[derive(Debug)]
pub(crate) struct Registration {
    pub(crate) id: u64,
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) owner: Arc<str>,
    pub(crate) lease_state: Arc<dyn Watched>,
    pub(crate) kind: LockKind,
    /// Renewed by the watchdog, or a fixed lease that runs out.
    pub(crate) lease_mode: Lease,
    /// When the holder must be told its lease is lost unless a renewal succeeds first
    /// ([`lost_deadline`]).
    pub(crate) expires_at: Instant,
}

#[derive(Debug, Default)]
pub(crate) struct Leases {
    pub(crate) entries: HashMap<u64, Registration>,
    pub(crate) deadlines: BTreeSet<(Instant, u64)>,
    /// The deadline the actor sleeps towards; an earlier one must wake it.
    pub(crate) planned_wake: Option<Instant>,
    /// The actor stopped (shutdown): nothing is registered any more.
    pub(crate) stopped: bool,
}

impl Leases {
    /// Adds `registration`; returns whether its deadline comes before the one the actor
    /// sleeps towards (the actor must then wake).
    pub(crate) fn insert(&mut self, registration: Registration) -> bool {
        let at = registration.expires_at;
        let earlier = self.planned_wake.is_none_or(|planned| at < planned);
        self.deadlines.insert((at, registration.id));
        self.entries.insert(registration.id, registration);
        earlier
    }

    /// Takes out every lease whose deadline is at or before `now`.
    pub(crate) fn take_expired(&mut self, now: Instant) -> Vec<Registration> {
        let due: Vec<u64> = self
            .deadlines
            .iter()
            .take_while(|(at, _)| *at <= now)
            .map(|(_, id)| *id)
            .collect();
        due.into_iter().filter_map(|id| self.remove(id)).collect()
    }

    pub(crate) fn remove(&mut self, id: u64) -> Option<Registration> {
        let entry = self.entries.remove(&id)?;
        self.deadlines.remove(&(entry.expires_at, id));
        Some(entry)
    }

    pub(crate) fn extend(&mut self, id: u64, expires_at: Instant) {
        if let Some(entry) = self.entries.get_mut(&id) {
            self.deadlines.remove(&(entry.expires_at, id));
            entry.expires_at = expires_at;
            entry.lease_state.extend_to(expires_at);
            self.deadlines.insert((expires_at, id));
        }
    }
}

/// When the holder of a lease sent to Redis at `sent_at` must be told it is lost, unless a
/// renewal succeeds first: a tenth of the lease before Redis may let it go, a margin for
/// late timers and for this machine's clock running at another rate than Redis's.
pub(crate) fn lost_deadline(sent_at: Instant, lease: Duration) -> Instant {
    sent_at + lease - lease / 10
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// A lease that records what the watchdog told it.
    #[derive(Debug, Default)]
    struct Recorded {
        fired: Mutex<Vec<LostReason>>,
        deadline: Mutex<Option<Instant>>,
    }

    impl Watched for Recorded {
        fn fire(&self, _lock: &str, reason: LostReason) {
            self.fired.lock().unwrap().push(reason);
        }

        fn extend_to(&self, deadline: Instant) {
            *self.deadline.lock().unwrap() = Some(deadline);
        }
    }

    fn registration(id: u64, expires_at: Instant, lease_state: Arc<Recorded>) -> Registration {
        Registration {
            id,
            keys: Arc::new(LockKeys::new("lock:", &format!("l{id}")).unwrap()),
            owner: format!("owner:{id}").into(),
            lease_state,
            kind: LockKind::Exclusive,
            lease_mode: Lease::Watchdog,
            expires_at,
        }
    }

    // Time is given, not slept: the table is read at chosen instants.
    #[test]
    fn the_deadline_table_expires_in_order_and_extends_what_is_renewed() {
        let start = Instant::now();
        let second = Duration::from_secs(1);
        let mut leases = Leases::default();
        let renewed = Arc::new(Recorded::default());
        assert!(leases.insert(registration(1, start + 3 * second, renewed.clone())));
        leases.planned_wake = Some(start + 3 * second);
        assert!(
            leases.insert(registration(2, start + second, Arc::default())),
            "an earlier deadline wakes the actor"
        );
        assert!(!leases.insert(registration(3, start + 5 * second, Arc::default())));

        // A renewal moves lease 1's deadline past lease 3's, and tells the lease.
        leases.extend(1, start + 9 * second);
        assert_eq!(*renewed.deadline.lock().unwrap(), Some(start + 9 * second));

        let expired: Vec<u64> = leases
            .take_expired(start + 6 * second)
            .iter()
            .map(|entry| entry.id)
            .collect();
        assert_eq!(expired, [2, 3], "due first, first out; lease 1 was renewed");
        assert_eq!(leases.deadlines.len(), 1);
        assert!(leases.remove(1).is_some() && leases.entries.is_empty());
        assert!(
            leases.deadlines.is_empty(),
            "no deadline outlives its entry"
        );
    }

    #[test]
    fn a_holder_is_told_a_tenth_of_the_lease_before_redis_lets_it_go() {
        let sent = Instant::now();
        let lease = Duration::from_secs(30);
        assert_eq!(lost_deadline(sent, lease), sent + Duration::from_secs(27));
    }
}
