//! The Lua scripts about locks, each described once in Rust (see `script.rs`): what it takes,
//! in what order, and what it answers. Each script's own file under `lua/` reads top to
//! bottom: what it does, in what order, and where it creates the shared functions of
//! `lua/lib/` it needs. The scripts run as Redis Functions, or by their SHA where functions
//! are refused (`lua.rs` loads them where a server lacks them).

mod acquire;
mod guarded;
mod plain_release;
mod promotion;
mod release;
mod singleton;
mod upkeep;

pub(crate) use acquire::{
    AcquireMode, AcquireReply, AcquireTerms, KnownEpoch, acquire, acquire_each,
};
pub(crate) use guarded::{WriteCommand, WriteTrace, write_if_held};
pub(crate) use plain_release::{PlainRelease, plain_release_fits, release_plainly};
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
use crate::wire::script_inputs::{Arg, OneArg, script_inputs};

script_inputs! {
    /// The four keys of a lock that most of its scripts take: its hash, the last token block
    /// granted from its queue, the queue, and the waiters' terms.
    pub(crate) struct LockKeyNames<'a> {
        keys {
            lock: &'a str,
            last_grant: &'a str,
            queue: &'a str,
            waiter_terms: &'a str,
        }
        args {}
    }
}

impl<'a> LockKeyNames<'a> {
    /// The keys of the lock with `keys`.
    pub(crate) fn of(keys: &'a LockKeys) -> Self {
        Self {
            lock: keys.hash(),
            last_grant: keys.last_grant(),
            queue: keys.queue(),
            waiter_terms: keys.waiter_terms(),
        }
    }
}

/// A read-write lock's role, as its scripts are told.
#[derive(Debug, Clone, Copy)]
struct Role(LockKind);

impl OneArg for Role {
    fn arg(&self) -> Arg<'_> {
        Arg::Text(match self.0 {
            LockKind::Read => "read",
            LockKind::Write => "write",
            LockKind::Exclusive | LockKind::Fair | LockKind::Semaphore { .. } => {
                unreachable!("only a read-write lock has roles")
            }
        })
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
