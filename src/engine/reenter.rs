//! More holds for a holder's owner: a re-entry of the same lock, or a read within a write
//! lock. Each script runs in a task of its own, so a hold Redis grants to a caller who has
//! left goes to a holder that is dropped, which releases it.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::engine::acquire::{Granted, LockRequest, ReservedTokens};
use crate::engine::deadlines::lost_deadline;
use crate::engine::hold::{Holder, OwnerHolds};
use crate::engine::release::GuardHold;
use crate::engine::replicas;
use crate::error::{ErrorKind, LockError, Result};
use crate::lease::Lease;
use crate::lock_kind::LockKind;
use crate::wire::scripts::{AcquireMode, AcquireReply, AcquireTerms};

/// Adds a hold to `holder`'s acquisition in Redis: the new hold, once Redis counted it and a
/// guard of the acquisition still lives.
pub(crate) async fn reenter(holder: Arc<Holder>) -> Result<GuardHold> {
    holder.acquisition.shared.ensure_running()?;
    // Counted before the script leaves, so no local hand-over starts meanwhile, and no
    // release within lets Redis drop the hold.
    holder.acquisition.lease_state.reentry_leaves(holder.number);
    holder.acquisition.holds.asking();
    run_detached(holder.clone(), async move {
        let acquisition = &holder.acquisition;
        let reply = acquisition
            .acquire_in_redis(&acquisition.terms, AcquireMode::Reenter)
            .await;
        // A hold counts only while a guard of the acquisition lives: once the last is
        // released (or the lock passed to the next local task), the hold Redis counted is
        // taken by that last release, which releases every hold of the owner.
        let granted = matches!(reply, Ok(AcquireReply::Acquired { .. }));
        let counted = acquisition.lease_state.reentry_back(holder.number, granted);
        if !counted {
            acquisition.holds.not_granted();
        }
        match reply {
            Ok(_) if counted => {
                let hold = GuardHold::new(holder.clone());
                // Not acknowledged: dropping the hold releases it.
                replicas::acknowledged(&acquisition.shared, &acquisition.keys).await?;
                Ok(hold)
            }
            Ok(_) => Err(LockError::new(
                ErrorKind::NotOwner,
                "the lock is no longer held by this owner",
            )),
            Err(err) => Err(err),
        }
    })
    .await
}

/// Takes a read hold within the write lock `holder` holds: the holder of that read hold,
/// with its own fencing token and lease (renewed if the write lock's is).
pub(crate) async fn read_within(holder: Arc<Holder>) -> Result<GuardHold> {
    let acquisition = holder.acquisition.clone();
    if acquisition.terms.kind != LockKind::Write {
        return Err(LockError::new(
            ErrorKind::NotOwner,
            "only the write guard of a read-write lock can read within its lock",
        ));
    }
    acquisition.shared.ensure_running()?;
    // Counted before the script leaves, so that no other read within lets Redis drop it.
    let reads = acquisition.reads_within();
    reads.asking();
    run_detached(holder, async move {
        let terms = AcquireTerms {
            kind: LockKind::Read,
            ..acquisition.terms
        };
        let sent_at = Instant::now();
        let reply = acquisition
            .acquire_in_redis(&terms, AcquireMode::ReadWithin)
            .await;
        let Ok(AcquireReply::Acquired {
            token,
            lease_left_ms,
            reserved,
        }) = reply
        else {
            reads.released();
            reply?;
            return Err(LockError::new(
                ErrorKind::NotOwner,
                "the write lock is no longer held by this owner",
            ));
        };
        let lease_mode = if acquisition.renewed() {
            Lease::Watchdog
        } else {
            Lease::Fixed(Duration::from_millis(terms.lease_ms))
        };
        let target = LockRequest {
            name: acquisition.name.clone(),
            keys: acquisition.keys.clone(),
            lease_mode,
            kind: LockKind::Read,
        };
        let left = u64::try_from(lease_left_ms).unwrap_or(terms.lease_ms);
        let granted = Granted {
            owner: acquisition.owner.clone(),
            tokens: ReservedTokens {
                first: token,
                reserved,
            },
            expires_at: lost_deadline(sent_at, Duration::from_millis(left)),
            terms,
        };
        // The owner's read holds may be other read guards': each releases only its own.
        let shared = &acquisition.shared;
        let holds = OwnerHolds::OnlyItsOwn(reads);
        let read = GuardHold::new(Arc::new(
            target.grant_of(shared, None, granted, holds, None),
        ));
        // Not acknowledged: dropping the hold releases it.
        replicas::acknowledged(shared, &acquisition.keys).await?;
        Ok(read)
    })
    .await
}

/// Runs `work` in a task of its own on the client's runtime and waits for its outcome; a
/// hold it yields after the caller left is dropped there, which releases it. The caller
/// checks first that the client runs.
async fn run_detached<T: Send + 'static>(
    holder: Arc<Holder>,
    work: impl Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    let (deliver, delivered) = oneshot::channel();
    holder.acquisition.shared.runtime.spawn(async move {
        let _ = deliver.send(work.await);
    });
    delivered
        .await
        .unwrap_or_else(|_| Err(LockError::shut_down()))
}
