//! The Lua scripts about locks, each described once in Rust (see `script.rs`): what it takes,
//! in what order, and what it answers. Each script's own file under `lua/` reads top to
//! bottom: what it does, in what order, and where it creates the shared functions of
//! `lua/lib/` it needs. The scripts run with EVALSHA (`lua.rs` reloads them on NOSCRIPT).

mod acquire;
mod guarded;
mod promotion;
mod release;
mod reply;
mod singleton;
mod upkeep;

pub(crate) use acquire::{
    AcquireMode, AcquireReply, AcquireTerms, KnownEpoch, acquire, acquire_each,
};
pub(crate) use guarded::{WriteCommand, WriteTrace, write_if_held};
pub(crate) use promotion::{Promotion, witness_promotion};
pub(crate) use release::{
    HandoverReply, ReleaseScope, force_unlock, handover, release, release_each,
};
pub(crate) use singleton::{
    ClaimMode, ClaimStatus, TickClaim, TickReply, claim_tick, record_leader,
};
pub(crate) use upkeep::{RenewReply, heartbeat, renew, waive_quarantine};

use crate::keys::LockKeys;
use crate::lock_kind::LockKind;
use crate::scopes::ScopeKeys;

/// The five keys of a lock that its scripts take first, in their order: the lock hash, the
/// last token block granted from its queue, the queue, the waiters' terms, and the token
/// counter of the lock's scope.
const LOCK_KEYS: [&str; 5] = [
    "LOCK",
    "LAST_GRANT",
    "QUEUE",
    "WAITER_TERMS",
    "TOKEN_COUNTER",
];

/// The values of [`LOCK_KEYS`] for the lock with `keys` in the scope of `scope_keys`.
fn lock_keys<'a>(keys: &'a LockKeys, scope_keys: &'a ScopeKeys) -> [&'a str; 5] {
    [
        keys.hash(),
        keys.last_grant(),
        keys.queue(),
        keys.waiter_terms(),
        scope_keys.tokens_key.as_str(),
    ]
}

/// The role a read-write lock's scripts are told.
fn rw_role(kind: LockKind) -> &'static str {
    match kind {
        LockKind::Read => "read",
        LockKind::Write => "write",
        LockKind::Exclusive | LockKind::Fair | LockKind::Semaphore { .. } => {
            unreachable!("only a read-write lock has roles")
        }
    }
}

/// Every script, for the check of each one's Lua against its description.
#[cfg(test)]
pub(crate) fn all() -> Vec<&'static dyn crate::wire::script::Described> {
    let mut all = acquire::all();
    all.extend(release::all());
    all.extend(upkeep::all());
    all.extend(guarded::all());
    all.extend(promotion::all());
    all.extend(singleton::all());
    all.push(crate::wire::snapshot::script());
    all
}
pub(crate) use crate::wire::replica_ack::write_and_wait_for_replicas;
