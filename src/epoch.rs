//! What this client knows of the server's epoch (see `scripts/epoch.lua`): the life of the
//! Redis data it has seen. A Redis that lost its data (a restart without persistence, a
//! failover to an empty replica) is noticed by the first script that runs there, and the
//! holders of the lost locks are told before the quarantine lets anyone else take them.

use std::sync::Mutex;
use std::time::Duration;

use crate::scripts::EpochTerms;

#[derive(Debug)]
pub(crate) struct Epoch {
    key: String,
    quarantine_ms: u64,
    /// 0 until a script told one. Learning a new epoch and collecting the leases it ends
    /// happen under this mutex, so no lease taken in the new epoch is counted among them.
    known: Mutex<u64>,
}

impl Epoch {
    pub(crate) fn new(key: String, quarantine: Duration) -> Self {
        Self {
            key,
            quarantine_ms: quarantine.as_millis() as u64,
            known: Mutex::new(0),
        }
    }

    /// What the scripts need: the key, the epoch known now, and the quarantine to start.
    pub(crate) fn terms(&self) -> EpochTerms<'_> {
        EpochTerms {
            key: &self.key,
            known: *self.known.lock().expect("epoch"),
            quarantine_ms: self.quarantine_ms,
        }
    }

    /// Records the epoch a script told; when it replaces an earlier one, Redis lost the data
    /// of that one, and `lost` collects what went with it (while no new lease can start).
    pub(crate) fn learn<T>(&self, epoch: u64, lost: impl FnOnce() -> T) -> Option<T> {
        let mut known = self.known.lock().expect("epoch");
        let earlier = std::mem::replace(&mut *known, epoch);
        (earlier != 0 && earlier != epoch).then(lost)
    }
}
