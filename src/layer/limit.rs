//! The layer's per-key limit ([`LockLayer::limit`](super::LockLayer::limit)): a request takes
//! one permit of the semaphore named by each of its keys, as it would take their locks.

use std::time::Duration;

use crate::client::LockClient;
use crate::error::Result;
use crate::guard::LockGuard;
use crate::keys::shown_all;
use crate::kind::LockKind;
use crate::lease::Lease;
use crate::lock::Lock;
use crate::meter::{counted, kind_label};

/// Takes one permit of each of the `permits`-permit semaphores `names`, all or nothing, in
/// the canonical order of locks (duplicates once), waiting at most `wait` in all. Counted
/// as one acquisition, as a request's locks are; on an error, or when the future is
/// dropped, the permits already taken go back in the background.
pub(crate) async fn take_permits(
    client: &LockClient,
    names: &[String],
    permits: u32,
    lease: Lease,
    wait: Duration,
) -> Result<Vec<LockGuard>> {
    let taking = async {
        let mut semaphores = names
            .iter()
            .map(|name| {
                let semaphore = client.semaphore(name, permits)?.with_lease(lease);
                Ok(semaphore.one_permit().clone())
            })
            .collect::<Result<Vec<Lock>>>()?;
        Lock::sort_canonically(&mut semaphores);
        let mut guards = Vec::with_capacity(semaphores.len());
        for semaphore in &semaphores {
            guards.push(semaphore.acquire_part().await?);
        }
        Ok(guards)
    };
    let bounded = async {
        match tokio::time::timeout(wait, taking).await {
            Ok(taken) => taken,
            Err(_) => Err(client.wait_bound_passed(&format!(
                "no permit of {} within {wait:?} (limit {permits} per key)",
                shown_all(names)
            ))),
        }
    };
    counted(
        kind_label(LockKind::Semaphore { permits, take: 1 }),
        bounded,
    )
    .await
}
