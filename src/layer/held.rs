//! The guards a layer holds for one request, and the guarded writes its handler makes under
//! them from its context ([`LockContext::write_if_held`](super::LockContext::write_if_held),
//! `IdempotencyContext::commit`).
//!
//! A handler does not own the guards: the layer does, and releases them when the request
//! ends, however it ends (a client gone, a lost lease). A write the handler started must
//! never land after that: a lock handed over locally goes to a task of this client with the
//! same owner id, which Redis cannot tell from this one. So the guards sit behind a gate:
//! each write holds it open until Redis answered (it runs in a task of its own, so a
//! cancelled handler does not leave it half done), and the layer closes it, waiting for the
//! writes under way, before the guards are released.

use std::sync::Arc;

use tokio::sync::RwLock;

use crate::error::{ErrorKind, LockError, Result};
use crate::guard::LockGuard;
use crate::guarded_write::GuardedWrites;

/// The layer's side: owns the guards, and releases them once no write runs under them.
#[derive(Debug, Default)]
pub(crate) struct HeldGuards {
    gate: Arc<RwLock<Vec<LockGuard>>>,
}

/// The handler's side: writes under a guard while the layer holds it.
#[derive(Debug, Clone)]
pub(crate) struct HeldWrites {
    gate: Arc<RwLock<Vec<LockGuard>>>,
}

impl HeldGuards {
    pub(crate) fn new(guards: Vec<LockGuard>) -> Self {
        Self {
            gate: Arc::new(RwLock::new(guards)),
        }
    }

    /// The way for the handler to write under these guards.
    pub(crate) fn writes(&self) -> HeldWrites {
        HeldWrites {
            gate: self.gate.clone(),
        }
    }
}

impl Drop for HeldGuards {
    /// Releases the guards now when no write runs under them, else once the writes under
    /// way are answered (in a task: a drop never waits).
    fn drop(&mut self) {
        if let Ok(mut guards) = self.gate.try_write() {
            drop(std::mem::take(&mut *guards));
            return;
        }
        let gate = self.gate.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let guards = std::mem::take(&mut *gate.write().await);
                drop(guards);
            });
        }
        // Outside a runtime the writes under way hold the last handles of the gate, and the
        // guards are released when the last of them ends.
    }
}

impl HeldWrites {
    /// Applies `writes` under the lock `name` (the first lock when `None`), as
    /// [`LockGuard::write_if_held`] does: `Ok(false)` once the layer gave it up.
    pub(crate) async fn write_if_held(
        &self,
        name: Option<&str>,
        writes: &GuardedWrites,
    ) -> Result<bool> {
        let gate = self.gate.clone();
        let (name, writes) = (name.map(str::to_owned), writes.clone());
        let write = tokio::spawn(async move {
            let guards = gate.read().await;
            let guard = match &name {
                None => guards.first(),
                Some(name) => guards.iter().find(|guard| guard.name() == name),
            };
            match guard {
                Some(guard) => guard.write_if_held(&writes).await,
                None if guards.is_empty() => Ok(false),
                None => Err(LockError::new(
                    ErrorKind::NotOwner,
                    format!(
                        "the request holds no lock named '{}'",
                        crate::keys::display_name(name.as_deref().unwrap_or_default())
                    ),
                )),
            }
        });
        match write.await {
            Ok(applied) => applied,
            Err(failed) if failed.is_panic() => std::panic::resume_unwind(failed.into_panic()),
            Err(_) => Err(LockError::new(
                ErrorKind::ShutDown,
                "the runtime shut down during a guarded write",
            )),
        }
    }
}
