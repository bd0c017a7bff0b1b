//! The last release of an exclusive or fair lock that nobody queued for, as two plain
//! commands instead of the release script: `HDEL` of the owner's field and `EXISTS` of the
//! lock, sent together. Redis runs them for under a third of what the script costs it (its
//! arguments, its Lua and the `HDEL` it calls), and they are as many commands as the
//! script's call (`FCALL`) and its `HDEL`.
//!
//! Only the owner's own field is deleted, never the two that say someone may wait (see
//! `lua/lib/queue.lua`): a lock that outlived this owner's lease and is another's now keeps
//! them. When the lock is still there after the owner's field went, someone queued meanwhile
//! and the lock is left marked with no holder: the release script then grants it to the first
//! live waiter, as every release does with a lock in that state, so a release whose script
//! failed or was lost with its connection is given back and grants it the same way. Until
//! then the marked lock keeps its lease: a look finds it held and waits, and nobody takes it.
//!
//! One server only: on a cluster a release leaves a trace (`lua/lib/release_trace.lua`) that
//! plain commands cannot.

use crate::keys::LockKeys;
use crate::lock_kind::LockKind;
use crate::scopes::ScopeKeys;
use crate::wire::conn::Conn;
use crate::wire::scripts::ReleaseScope;

/// What the plain commands of a release found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PlainRelease {
    /// The owner's hold is gone, and with it the lock: nobody waits.
    Released,
    /// The owner's hold is gone and the lock is still there: marked, so someone queued (or
    /// taken meanwhile by a newcomer). The release script must run for it.
    Marked,
    /// The owner held nothing (a lease lost): the release script finds what else it may
    /// have left.
    NotHeld,
}

/// Whether a release of `kind` in `scope` and `scope_keys` may go out as plain commands:
/// every hold of an exclusive or fair lock, on one server.
pub(crate) fn plain_release_fits(
    kind: LockKind,
    scope: ReleaseScope,
    scope_keys: &ScopeKeys,
) -> bool {
    scope == ReleaseScope::All
        && scope_keys.trace_ms == 0
        && matches!(kind, LockKind::Exclusive | LockKind::Fair)
}

/// Deletes `owner`'s field of the lock with `keys` and looks whether the lock is still there.
pub(crate) async fn release_plainly(
    conn: &mut Conn,
    keys: &LockKeys,
    owner: &str,
) -> redis::RedisResult<PlainRelease> {
    let mut commands = redis::pipe();
    commands.hdel(keys.hash(), owner).exists(keys.hash());
    let (removed, still_there): (u64, bool) = commands.query_async(conn).await?;
    Ok(match (removed, still_there) {
        (0, _) => PlainRelease::NotHeld,
        (_, false) => PlainRelease::Released,
        (_, true) => PlainRelease::Marked,
    })
}
