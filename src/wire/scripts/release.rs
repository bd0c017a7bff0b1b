//! The scripts that give a lock back: release, the local hand-over, and force-unlock, for an
//! exclusive (or fair) lock, a read-write lock and a semaphore.

use crate::keys::LockKeys;
use crate::lock_kind::LockKind;
use crate::scopes::ScopeKeys;
use crate::wire::conn::Conn;
use crate::wire::script::{Arg, ScriptSpec, joined, joined_values, reply_statuses};
use crate::wire::scripts::acquire::AcquireTerms;
use crate::wire::scripts::reply::{ScriptReply, run};
use crate::wire::scripts::{LOCK_KEYS, lock_keys, rw_role};

reply_statuses! {
    /// What a release answers.
    released {
        /// `{RELEASED, holds left}`.
        RELEASED = 1,
        /// The owner held nothing.
        NOT_HELD = -1,
    }
}

reply_statuses! {
    /// What a hand-over answers besides [`released::NOT_HELD`].
    handed_off {
        /// `{PASSED, server ms, last token}`: another instance got the lock.
        PASSED = 2,
        /// `{KEPT, first token, tokens reserved}`: nobody else waits, the owner keeps it.
        KEPT = 3,
    }
}

reply_statuses! {
    /// What a force-unlock answers.
    unlocked {
        /// A lock was removed.
        REMOVED = 1,
        /// It was free.
        WAS_FREE = 0,
    }
}

static RELEASE: ScriptSpec<5, 3> = ScriptSpec::new(
    "release.lua",
    include_str!("../lua/release.lua"),
    LOCK_KEYS,
    ["WAKE_PREFIX", "OWNER", "SCOPE"],
    &[released::ALL],
)
.with_short_reply(released::RELEASED);

static HANDOFF: ScriptSpec<5, 6> = ScriptSpec::new(
    "handoff.lua",
    include_str!("../lua/handoff.lua"),
    LOCK_KEYS,
    [
        "WAKE_PREFIX",
        "OWNER",
        "NEXT_OWNER",
        "ALIVE_MS",
        "LEASE_MS",
        "TOKEN_BLOCK",
    ],
    &[released::ALL, handed_off::ALL],
);

static RW_RELEASE: ScriptSpec<6, 4> = ScriptSpec::new(
    "rw_release.lua",
    include_str!("../lua/rw_release.lua"),
    joined(LOCK_KEYS, ["READERS"]),
    ["WAKE_PREFIX", "OWNER", "SCOPE", "ROLE"],
    &[released::ALL],
);

static SEM_RELEASE: ScriptSpec<6, 3> = ScriptSpec::new(
    "sem_release.lua",
    include_str!("../lua/sem_release.lua"),
    joined(LOCK_KEYS, ["HOLDERS"]),
    ["WAKE_PREFIX", "OWNER", "SCOPE"],
    &[released::ALL],
);

static FORCE_UNLOCK: ScriptSpec<6, 1> = ScriptSpec::new(
    "force_unlock.lua",
    include_str!("../lua/force_unlock.lua"),
    joined(LOCK_KEYS, ["READERS"]),
    ["WAKE_PREFIX"],
    &[unlocked::ALL],
);

static RW_FORCE_UNLOCK: ScriptSpec<6, 1> = ScriptSpec::new(
    "rw_force_unlock.lua",
    include_str!("../lua/rw_force_unlock.lua"),
    joined(LOCK_KEYS, ["READERS"]),
    ["WAKE_PREFIX"],
    &[unlocked::ALL],
);

static SEM_FORCE_UNLOCK: ScriptSpec<6, 1> = ScriptSpec::new(
    "sem_force_unlock.lua",
    include_str!("../lua/sem_force_unlock.lua"),
    joined(LOCK_KEYS, ["HOLDERS"]),
    ["WAKE_PREFIX"],
    &[unlocked::ALL],
);

#[cfg(test)]
pub(super) fn all() -> Vec<&'static dyn crate::wire::script::Described> {
    vec![
        &RELEASE,
        &HANDOFF,
        &RW_RELEASE,
        &SEM_RELEASE,
        &FORCE_UNLOCK,
        &RW_FORCE_UNLOCK,
        &SEM_FORCE_UNLOCK,
    ]
}

/// How many holds a release drops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseScope {
    /// One hold (the normal release of one guard).
    One,
    /// Every hold of the owner and its place in the queue (an acquisition nobody saw, or
    /// shutdown).
    All,
}

/// What a hand-over release answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HandoffReply {
    /// Another instance got the lock; the next owner is queued behind it (the server's clock
    /// and the last fencing token reserved in the lock's scope then, as a look's).
    Passed { server_ms: u64, last_token: u64 },
    /// Nobody else waits: still held by the same owner, with a fresh token block: its first
    /// token and how many were reserved (fewer than asked when the scope's counter ran ahead).
    Kept { token: u64, reserved: u64 },
    /// The owner no longer held the lock.
    NotOwner,
}

/// Returns the owner's remaining hold count, or `None` when it held nothing.
pub(crate) async fn release(
    conn: &mut Conn,
    keys: &LockKeys,
    kind: LockKind,
    names: &ScopeKeys,
    owner: &str,
    scope: ReleaseScope,
) -> redis::RedisResult<Option<u64>> {
    let lock_keys = lock_keys(keys, names);
    let scope = Arg::Text(match scope {
        ReleaseScope::One => "one",
        ReleaseScope::All => "all",
    });
    let args = [Arg::Text(&names.wake_prefix), Arg::Text(owner), scope];
    let reply = match kind {
        LockKind::Exclusive | LockKind::Fair => {
            run(&RELEASE, conn, &RELEASE.command(lock_keys, args)).await?
        }
        LockKind::Read | LockKind::Write => {
            let keys = joined_values(lock_keys, [keys.readers()]);
            let role = Arg::Text(rw_role(kind));
            let cmd = RW_RELEASE.command(keys, joined_values(args, [role]));
            run(&RW_RELEASE, conn, &cmd).await?
        }
        LockKind::Semaphore { .. } => {
            let keys = joined_values(lock_keys, [keys.readers()]);
            run(&SEM_RELEASE, conn, &SEM_RELEASE.command(keys, args)).await?
        }
    };
    match reply.status() {
        released::RELEASED => Ok(Some(reply.non_negative(0))),
        released::NOT_HELD => Ok(None),
        _ => Err(reply.unknown()),
    }
}

/// Releases the last hold of `owner` while `next_owner`, a task of the same instance, waits.
pub(crate) async fn handoff(
    conn: &mut Conn,
    keys: &LockKeys,
    names: &ScopeKeys,
    owner: &str,
    next_owner: &str,
    terms: &AcquireTerms,
) -> redis::RedisResult<HandoffReply> {
    let cmd = HANDOFF.command(
        lock_keys(keys, names),
        [
            Arg::Text(&names.wake_prefix),
            Arg::Text(owner),
            Arg::Text(next_owner),
            Arg::Number(terms.alive_ms),
            Arg::Number(terms.lease_ms),
            Arg::Number(terms.block),
        ],
    );
    let reply = run(&HANDOFF, conn, &cmd).await?;
    Ok(match reply.status() {
        handed_off::PASSED => HandoffReply::Passed {
            server_ms: reply.non_negative(0),
            last_token: reply.non_negative(1),
        },
        handed_off::KEPT => HandoffReply::Kept {
            token: reply.non_negative(0),
            reserved: reply.non_negative(1).max(1),
        },
        released::NOT_HELD => HandoffReply::NotOwner,
        _ => return Err(reply.unknown()),
    })
}

/// Removes the lock whoever holds it; returns whether one was held. Every kind removes the
/// readers' index too: a plain lock's name may be read-held.
pub(crate) async fn force_unlock(
    conn: &mut Conn,
    keys: &LockKeys,
    kind: LockKind,
    names: &ScopeKeys,
) -> redis::RedisResult<bool> {
    let script = match kind {
        LockKind::Exclusive | LockKind::Fair => &FORCE_UNLOCK,
        LockKind::Read | LockKind::Write => &RW_FORCE_UNLOCK,
        LockKind::Semaphore { .. } => &SEM_FORCE_UNLOCK,
    };
    let keys = joined_values(lock_keys(keys, names), [keys.readers()]);
    let cmd = script.command(keys, [Arg::Text(&names.wake_prefix)]);
    let reply: ScriptReply = run(script, conn, &cmd).await?;
    match reply.status() {
        unlocked::REMOVED => Ok(true),
        unlocked::WAS_FREE => Ok(false),
        _ => Err(reply.unknown()),
    }
}
