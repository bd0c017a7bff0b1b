//! What this client knows of the server's epoch (see `wire/lua/lib/epoch.lua`): the life of the
//! Redis data it has seen, and the longest lease granted in it. A Redis without its epoch
//! (it lost its data, or is new) is noticed by the first script that runs there: unless the
//! server has been up longer than every lease (and shows no other loss), a quarantine then
//! covers the lease limit every client keeps to and the longest lease the client knows of,
//! and the holders of the lost locks are told before anyone else can take them. On a cluster
//! each slot has an epoch of its own (see `scopes.rs`), so a node that fails over to a replica
//! without the data quarantines and loses only the locks of its own slots.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::{Instant, sleep_until};

use crate::keys::LockKeys;
use crate::meter;
use crate::scopes::Placement;
use crate::wire::scripts::KnownEpoch;

#[derive(Debug)]
pub(crate) struct Epoch {
    /// Where each scope's epoch key is: one for a server, one per slot of a cluster.
    placement: Arc<Placement>,
    /// The longest lease this client grants (`lease_limit`), which every client of one
    /// Redis keeps to: the shortest quarantine it starts on a missing epoch.
    lease_limit_ms: u64,
    /// The server fsyncs every write, so a restart from its files loses nothing
    /// (`LockClientBuilder::restart_keeps_writes`).
    keeps_writes: bool,
    /// What a script told last, per scope. Learning a new epoch and collecting the leases it
    /// ends happen under this mutex, so no lease taken in the new epoch is counted among them.
    known: Mutex<Vec<Known>>,
    /// When the restart quarantine this client last heard of ends, on this client's clock;
    /// `None` once its end has been logged.
    quarantine_until: Arc<Mutex<Option<Instant>>>,
}

/// The epoch a client knows (0 until a script told one), the longest lease granted in it as
/// far as the client knows, and the name of their marker (see `wire/lua/lib/epoch.lua`), made
/// once per change.
#[derive(Debug, Default, Clone)]
struct Known {
    epoch: u64,
    longest_lease_ms: u64,
    marker: Option<Arc<str>>,
}

impl Known {
    fn new(epoch_key: &str, epoch: u64, longest_lease_ms: u64) -> Self {
        Self {
            epoch,
            longest_lease_ms,
            marker: Some(format!("{epoch_key}:{epoch}:{longest_lease_ms}").into()),
        }
    }
}

impl Epoch {
    pub(crate) fn new(
        placement: Arc<Placement>,
        lease_limit: Duration,
        keeps_writes: bool,
    ) -> Self {
        let scopes = placement.scopes().len();
        Self {
            placement,
            lease_limit_ms: lease_limit.as_millis() as u64,
            keeps_writes,
            known: Mutex::new(vec![Known::default(); scopes]),
            quarantine_until: Arc::default(),
        }
    }

    /// The scope of the lock with `keys` (its slot on a cluster).
    pub(crate) fn scope_of(&self, keys: &LockKeys) -> u16 {
        self.placement.scope_of(keys)
    }

    /// [`Self::known`] for the lock with `keys`.
    pub(crate) fn known_for(&self, keys: &LockKeys) -> KnownEpoch<'_> {
        self.known(self.scope_of(keys))
    }

    /// The epoch known in `scope`, as a script needs it: the key, the epoch known now, its longest lease and their marker,
    /// and the quarantine to start on a missing epoch, long enough for every lease it knows of
    /// to run out.
    pub(crate) fn known(&self, scope: u16) -> KnownEpoch<'_> {
        let key = &self.placement.scope_keys(scope).epoch_key;
        let known = self.known.lock().expect("epoch")[usize::from(scope)].clone();
        KnownEpoch {
            key,
            known: known.epoch,
            known_lease_ms: known.longest_lease_ms,
            // Before any epoch is known, a marker no script writes.
            marker: known.marker.unwrap_or_else(|| format!("{key}:0:0").into()),
            quarantine_ms: self.lease_limit_ms.max(known.longest_lease_ms),
            keeps_writes: self.keeps_writes,
        }
    }

    /// Records that a lease of `lease_ms` was granted in `epoch` of `scope`: the script made
    /// it the epoch's longest if it was longer, so the client knows that longest without
    /// being told, and names its marker next time.
    pub(crate) fn granted(&self, scope: u16, epoch: u64, lease_ms: u64) {
        let mut known = self.known.lock().expect("epoch");
        let current = &mut known[usize::from(scope)];
        if current.epoch == epoch && epoch != 0 && current.longest_lease_ms < lease_ms {
            *current = Known::new(&self.placement.scope_keys(scope).epoch_key, epoch, lease_ms);
        }
    }

    /// Records the epoch and longest lease a script told of `scope`; when the epoch replaces
    /// an earlier one, Redis lost the data of that one, and `lost` collects what went with it
    /// (while no new lease can start).
    pub(crate) fn learn<T>(
        &self,
        scope: u16,
        epoch: u64,
        longest_lease_ms: u64,
        lost: impl FnOnce() -> T,
    ) -> Option<T> {
        let learned = Known::new(
            &self.placement.scope_keys(scope).epoch_key,
            epoch,
            longest_lease_ms,
        );
        let mut known = self.known.lock().expect("epoch");
        let earlier = std::mem::replace(&mut known[usize::from(scope)], learned);
        (earlier.epoch != 0 && earlier.epoch != epoch).then(lost)
    }

    /// Records a restart quarantine a script reported, `left` from now. Its start and its end
    /// are logged once each (WARN): every lock of this Redis waits meanwhile, and operators
    /// should see why.
    pub(crate) fn note_quarantine(&self, left: Duration) {
        let ends = Instant::now() + left;
        let started = {
            let mut until = self.quarantine_until.lock().expect("quarantine");
            let running = until.is_some_and(|end| end > Instant::now());
            if until.is_none() {
                // Counted while an end is kept: each end is cleared once, below or waived.
                meter::quarantine(true);
            }
            if until.is_none_or(|end| end < ends) {
                *until = Some(ends);
            }
            !running
        };
        if !started {
            return;
        }
        tracing::warn!(
            left_ms = left.as_millis() as u64,
            "restart quarantine: this Redis lost its lock epoch with its data (a restart \
             without persistence, a failover to an empty replica, a flush, an eviction), \
             restarted from files that may miss writes (a snapshot, appendfsync everysec), \
             or started less than the lease limit ago; no lock is granted until every lease \
             granted before could have run out. Once every holder is known to have stopped, \
             `lockctl waive-quarantine` (LockClient::waive_restart_quarantine) ends it"
        );
        let until = self.quarantine_until.clone();
        tokio::spawn(async move {
            loop {
                let Some(end) = *until.lock().expect("quarantine") else {
                    return;
                };
                if end > Instant::now() {
                    sleep_until(end).await;
                    continue;
                }
                // Logged by the one task that clears this end, if another started meanwhile.
                let mut current = until.lock().expect("quarantine");
                if *current == Some(end) {
                    *current = None;
                    meter::quarantine(false);
                    drop(current);
                    tracing::warn!("restart quarantine over: locks are granted again");
                }
                return;
            }
        });
    }

    /// Forgets the quarantine this client heard of: an operator waived it.
    pub(crate) fn waived(&self) {
        let ended = {
            let mut until = self.quarantine_until.lock().expect("quarantine");
            let ended = until.take();
            if ended.is_some() {
                meter::quarantine(false);
            }
            ended
        };
        if ended.is_some() {
            tracing::warn!("restart quarantine waived: locks are granted again");
        }
    }

    /// How long the restart quarantine this client heard of still runs, if it does.
    pub(crate) fn quarantine_left(&self) -> Option<Duration> {
        let until = *self.quarantine_until.lock().expect("quarantine");
        until
            .map(|end| end.saturating_duration_since(Instant::now()))
            .filter(|left| !left.is_zero())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quarantine_covers_every_lease_the_client_knows_of() {
        let epoch = Epoch::new(
            Arc::new(Placement::single("lock:")),
            Duration::from_secs(30),
            false,
        );
        let fresh = epoch.known(0);
        assert_eq!((fresh.known, fresh.known_lease_ms), (0, 0));
        assert_eq!(&*fresh.marker, "lock:epoch:0:0");
        // The lease limit, which every client keeps to.
        assert_eq!(fresh.quarantine_ms, 30_000);
        // A longer lease another client recorded in this epoch.
        assert_eq!(epoch.learn(0, 7, 60_000, || ()), None);
        let learned = epoch.known(0);
        assert_eq!((learned.known, learned.known_lease_ms), (7, 60_000));
        assert_eq!(&*learned.marker, "lock:epoch:7:60000");
        assert_eq!(learned.quarantine_ms, 60_000);
        // Its own longer lease granted in that epoch, and a grant in another epoch.
        epoch.granted(0, 7, 90_000);
        epoch.granted(0, 6, 120_000);
        let granted = epoch.known(0);
        assert_eq!(
            (granted.known_lease_ms, &*granted.marker),
            (90_000, "lock:epoch:7:90000")
        );
        // A new epoch: the data of the earlier one is lost.
        assert_eq!(epoch.learn(0, 8, 2_000, || "lost"), Some("lost"));
        assert_eq!(epoch.known(0).quarantine_ms, 30_000);
    }

    #[tokio::test(start_paused = true)]
    async fn a_quarantine_is_known_until_it_ends_and_a_later_report_extends_it() {
        let epoch = Epoch::new(
            Arc::new(Placement::single("lock:")),
            Duration::from_secs(30),
            false,
        );
        assert_eq!(epoch.quarantine_left(), None);
        epoch.note_quarantine(Duration::from_secs(3));
        assert_eq!(epoch.quarantine_left(), Some(Duration::from_secs(3)));
        tokio::time::advance(Duration::from_secs(1)).await;
        epoch.note_quarantine(Duration::from_secs(4));
        assert_eq!(epoch.quarantine_left(), Some(Duration::from_secs(4)));
        tokio::time::advance(Duration::from_secs(4)).await;
        assert_eq!(epoch.quarantine_left(), None);
    }
}
