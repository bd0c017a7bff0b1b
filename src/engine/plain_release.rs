//! The last release of a lock taken with nobody queued, as plain commands first (see
//! `wire/scripts/plain_release.rs`): when they find the lock marked, the release script
//! grants it on. Whatever stops that script (an error, the caller cancelling between the two
//! steps) gives the release back in the background, where the script grants a lock left
//! marked with no holder: the hold is released all the same, and its waiters are granted.

use crate::engine::hold::Acquisition;
use crate::error::Result;
use crate::keys::display_name;
use crate::lock_kind::LockKind;
use crate::scopes::ScopeKeys;
use crate::wire::scripts::{self, PlainRelease, ReleaseScope};

/// Releases `acquisition`'s holds in `scope`: by plain commands first when it is the last
/// release of a lock its look took with nobody queued, and otherwise by the release script.
/// Returns the holds left, or `None` when its owner held nothing.
pub(crate) async fn release(acquisition: &Acquisition, scope: ReleaseScope) -> Result<Option<u64>> {
    let (kind, scope_keys) = (
        acquisition.terms.kind,
        acquisition.shared.scope_keys(&acquisition.keys),
    );
    if acquisition.taken_unqueued && scripts::plain_release_fits(kind, scope, scope_keys) {
        return release_last(acquisition, kind, scope_keys).await;
    }
    acquisition.run_release_script(scope).await
}

/// Releases every hold of `acquisition` (an exclusive or fair lock of `kind` on one server,
/// whose scope's keys are `scope_keys`): the holds left (0), or `None` when its owner held
/// nothing.
async fn release_last(
    acquisition: &Acquisition,
    kind: LockKind,
    scope_keys: &ScopeKeys,
) -> Result<Option<u64>> {
    let (keys, owner) = (&acquisition.keys, &acquisition.owner);
    let connections = &acquisition.shared.connections;
    let mut unfinished = Unfinished {
        acquisition,
        armed: true,
    };
    let plain = connections
        .run(keys.hash(), |mut conn| async move {
            scripts::release_plainly(&mut conn, keys, owner).await
        })
        .await;
    let plain = match plain {
        Ok(PlainRelease::Released) => {
            unfinished.armed = false;
            return Ok(Some(0));
        }
        Ok(plain) => plain,
        // The caller gives back what a release left unconfirmed, as after a script.
        Err(err) => {
            unfinished.armed = false;
            return Err(err);
        }
    };
    let script = connections
        .run(keys.hash(), |mut conn| async move {
            scripts::release(&mut conn, keys, kind, scope_keys, owner, ReleaseScope::All).await
        })
        .await;
    match (plain, script) {
        // The hold is gone: only the grant is left, which the give-back makes.
        (PlainRelease::Marked, Err(err)) => {
            tracing::debug!(
                lock = %display_name(&acquisition.name),
                error = %err,
                "a release's grant failed: given back"
            );
            Ok(Some(0))
        }
        (PlainRelease::Marked, Ok(_)) => {
            unfinished.armed = false;
            Ok(Some(0))
        }
        (_, script) => {
            unfinished.armed = false;
            script
        }
    }
}

/// A plain release not carried to its end: given back when dropped armed.
struct Unfinished<'a> {
    acquisition: &'a Acquisition,
    armed: bool,
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if self.armed {
            let acquisition = self.acquisition;
            acquisition.give_back_later(acquisition.owner.clone());
        }
    }
}
