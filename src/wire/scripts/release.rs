//! The scripts that give a lock back: release, the local hand-over, and force-unlock, for an
//! exclusive (or fair) lock, a read-write lock and a semaphore.

use crate::keys::LockKeys;
use crate::lock_kind::LockKind;
use crate::scopes::ScopeKeys;
use crate::wire::conn::Conn;
use crate::wire::script::{Arg, Each, ScriptSpec, joined, joined_values, reply_statuses};
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
    handed_over {
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

/// The key of a release's trace and how long it is kept, after the lock's own keys and
/// arguments (see `lua/lib/release_trace.lua`).
const TRACE_KEY: &str = "RELEASE_TRACE";
const TRACE_MS: &str = "RELEASE_TRACE_MS";

static RELEASE: ScriptSpec<6, 4> = ScriptSpec::new(
    "release.lua",
    include_str!("../lua/release.lua"),
    joined(LOCK_KEYS, [TRACE_KEY]),
    ["WAKE_PREFIX", "OWNER", "SCOPE", TRACE_MS],
    &[released::ALL],
)
.with_short_reply(released::RELEASED);

/// [`RELEASE`] of every hold of many owners of one scope at once, each of a lock of its own:
/// the keys and argument that differ per lock and owner are given per item, the rest once,
/// and the script's code runs once per item. It answers a table of what [`RELEASE`] answers
/// each.
static RELEASE_EACH: ScriptSpec<1, 3> = ScriptSpec::new(
    "release.lua",
    include_str!("../lua/release.lua"),
    ["TOKEN_COUNTER"],
    ["WAKE_PREFIX", "SCOPE", TRACE_MS],
    &[released::ALL],
)
.with_each(Each {
    keys: &["LOCK", "LAST_GRANT", "QUEUE", "WAITER_TERMS", TRACE_KEY],
    args: &["OWNER"],
})
.with_code_per_item(&["clock", "counter"])
.with_short_reply(released::RELEASED);

static HANDOVER: ScriptSpec<6, 7> = ScriptSpec::new(
    "handover.lua",
    include_str!("../lua/handover.lua"),
    joined(LOCK_KEYS, [TRACE_KEY]),
    [
        "WAKE_PREFIX",
        "OWNER",
        "NEXT_OWNER",
        "ALIVE_MS",
        "LEASE_MS",
        "TOKEN_BLOCK",
        TRACE_MS,
    ],
    &[released::ALL, handed_over::ALL],
);

static RW_RELEASE: ScriptSpec<7, 6> = ScriptSpec::new(
    "rw_release.lua",
    include_str!("../lua/rw_release.lua"),
    joined(LOCK_KEYS, ["READERS", TRACE_KEY]),
    ["WAKE_PREFIX", "OWNER", "SCOPE", TRACE_MS, "ROLE", "KEEP"],
    &[released::ALL],
);

static SEM_RELEASE: ScriptSpec<7, 4> = ScriptSpec::new(
    "sem_release.lua",
    include_str!("../lua/sem_release.lua"),
    joined(LOCK_KEYS, ["HOLDERS", TRACE_KEY]),
    ["WAKE_PREFIX", "OWNER", "SCOPE", TRACE_MS],
    &[released::ALL],
);

static FORCE_UNLOCK: ScriptSpec<7, 3> = ScriptSpec::new(
    "force_unlock.lua",
    include_str!("../lua/force_unlock.lua"),
    joined(LOCK_KEYS, ["READERS", TRACE_KEY]),
    ["WAKE_PREFIX", "OWNER", TRACE_MS],
    &[unlocked::ALL],
);

static RW_FORCE_UNLOCK: ScriptSpec<7, 3> = ScriptSpec::new(
    "rw_force_unlock.lua",
    include_str!("../lua/rw_force_unlock.lua"),
    joined(LOCK_KEYS, ["READERS", TRACE_KEY]),
    ["WAKE_PREFIX", "OWNER", TRACE_MS],
    &[unlocked::ALL],
);

static SEM_FORCE_UNLOCK: ScriptSpec<7, 3> = ScriptSpec::new(
    "sem_force_unlock.lua",
    include_str!("../lua/sem_force_unlock.lua"),
    joined(LOCK_KEYS, ["HOLDERS", TRACE_KEY]),
    ["WAKE_PREFIX", "OWNER", TRACE_MS],
    &[unlocked::ALL],
);

#[cfg(test)]
pub(super) fn all() -> Vec<&'static dyn crate::wire::script::Described> {
    vec![
        &RELEASE,
        &RELEASE_EACH,
        &HANDOVER,
        &RW_RELEASE,
        &SEM_RELEASE,
        &FORCE_UNLOCK,
        &RW_FORCE_UNLOCK,
        &SEM_FORCE_UNLOCK,
    ]
}

/// The key of a release's trace where one is left; one server leaves none, and is given the
/// lock's own name, which its scripts never read as a trace (no name to build per release).
fn trace_key<'a>(keys: &'a LockKeys, scope_keys: &ScopeKeys) -> &'a str {
    if scope_keys.trace_ms == 0 {
        keys.hash()
    } else {
        keys.release_trace()
    }
}

/// How many holds a release drops. Each leaves Redis as it should be if the script runs
/// twice (redis-rs's cluster client sends it again after a dropped connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseScope {
    /// One hold, never the last: the acquisition's other guards still hold the lock, so
    /// Redis keeps at least one hold whatever it counted.
    Partial,
    /// One read hold within a write lock, whose owner's other read holds within are other
    /// acquisitions': `keep` of them are still needed by this client's guards, and stay.
    OneWithin { keep: u64 },
    /// Every hold of the owner and its place in the queue: the last release of an
    /// acquisition, one nobody saw, or shutdown.
    All,
}

impl ReleaseScope {
    /// As the release scripts name it.
    fn as_lua(self) -> &'static str {
        match self {
            ReleaseScope::Partial => "partial",
            ReleaseScope::OneWithin { .. } => "one",
            ReleaseScope::All => "all",
        }
    }

    /// The read holds within a write lock that stay (0 for any other release).
    fn keep(self) -> u64 {
        match self {
            ReleaseScope::OneWithin { keep } => keep,
            ReleaseScope::Partial | ReleaseScope::All => 0,
        }
    }
}

/// What a hand-over release answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HandoverReply {
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
    scope_keys: &ScopeKeys,
    owner: &str,
    scope: ReleaseScope,
) -> redis::RedisResult<Option<u64>> {
    let lock_keys = lock_keys(keys, scope_keys);
    let trace = trace_key(keys, scope_keys);
    let args = [
        Arg::Text(&scope_keys.wake_prefix),
        Arg::Text(owner),
        Arg::Text(scope.as_lua()),
        Arg::Number(scope_keys.trace_ms),
    ];
    let reply = match kind {
        LockKind::Exclusive | LockKind::Fair => {
            let keys = joined_values(lock_keys, [trace]);
            run(&RELEASE, conn, &RELEASE.command(keys, args)).await?
        }
        LockKind::Read | LockKind::Write => {
            let keys = joined_values(lock_keys, [keys.readers(), trace]);
            let role = Arg::Text(rw_role(kind));
            let keep = Arg::Number(scope.keep());
            let cmd = RW_RELEASE.command(keys, joined_values(args, [role, keep]));
            run(&RW_RELEASE, conn, &cmd).await?
        }
        LockKind::Semaphore { .. } => {
            let keys = joined_values(lock_keys, [keys.readers(), trace]);
            run(&SEM_RELEASE, conn, &SEM_RELEASE.command(keys, args)).await?
        }
    };
    released_holds(&reply)
}

/// Every hold of each of `owners` (each of an exclusive or fair lock of its own in the scope
/// of `scope_keys`) released in one call: the holds left for each (`None`: it held nothing), in
/// their order, or the error of the whole call.
pub(crate) async fn release_each(
    conn: &mut Conn,
    owners: &[(&LockKeys, &str)],
    scope_keys: &ScopeKeys,
) -> redis::RedisResult<Vec<redis::RedisResult<Option<u64>>>> {
    let args = [
        Arg::Text(&scope_keys.wake_prefix),
        Arg::Text(ReleaseScope::All.as_lua()),
        Arg::Number(scope_keys.trace_ms),
    ];
    let items: Vec<([&str; 5], [Arg<'_>; 1])> = owners
        .iter()
        .map(|(keys, owner)| {
            let item_keys = [
                keys.hash(),
                keys.last_grant(),
                keys.queue(),
                keys.waiter_terms(),
                trace_key(keys, scope_keys),
            ];
            (item_keys, [Arg::Text(owner)])
        })
        .collect();
    let cmd = RELEASE_EACH.command_each([scope_keys.tokens_key.as_str()], args, &items);
    let replies: Vec<redis::Value> = RELEASE_EACH.lua().run(conn, &cmd).await?;
    if replies.len() != owners.len() {
        return Err(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "release.lua answered another count of items than it was given",
        )));
    }
    Ok(replies
        .into_iter()
        .map(|value| {
            let reply = ScriptReply::read(RELEASE_EACH.file, value, RELEASE_EACH.short_reply)?;
            released_holds(&reply)
        })
        .collect())
}

/// What a release's `reply` says: the holds left, or `None` when the owner held nothing.
fn released_holds(reply: &ScriptReply) -> redis::RedisResult<Option<u64>> {
    match reply.status() {
        released::RELEASED => Ok(Some(reply.non_negative(0))),
        released::NOT_HELD => Ok(None),
        _ => Err(reply.unknown()),
    }
}

/// Releases the last hold of `owner` while `next_owner`, a task of the same instance, waits.
pub(crate) async fn handover(
    conn: &mut Conn,
    keys: &LockKeys,
    scope_keys: &ScopeKeys,
    owner: &str,
    next_owner: &str,
    terms: &AcquireTerms,
) -> redis::RedisResult<HandoverReply> {
    let cmd = HANDOVER.command(
        joined_values(lock_keys(keys, scope_keys), [trace_key(keys, scope_keys)]),
        [
            Arg::Text(&scope_keys.wake_prefix),
            Arg::Text(owner),
            Arg::Text(next_owner),
            Arg::Number(terms.alive_ms),
            Arg::Number(terms.lease_ms),
            Arg::Number(terms.block),
            Arg::Number(scope_keys.trace_ms),
        ],
    );
    let reply = run(&HANDOVER, conn, &cmd).await?;
    Ok(match reply.status() {
        handed_over::PASSED => HandoverReply::Passed {
            server_ms: reply.non_negative(0),
            last_token: reply.non_negative(1),
        },
        handed_over::KEPT => HandoverReply::Kept {
            token: reply.non_negative(0),
            reserved: reply.non_negative(1).max(1),
        },
        released::NOT_HELD => HandoverReply::NotOwner,
        _ => return Err(reply.unknown()),
    })
}

/// Removes the lock whoever holds it; returns whether one was held. Every kind removes the
/// readers' index too: a plain lock's name may be read-held. `operation` names this
/// force-unlock alone, for its trace where it may run twice.
pub(crate) async fn force_unlock(
    conn: &mut Conn,
    keys: &LockKeys,
    kind: LockKind,
    scope_keys: &ScopeKeys,
    operation: &str,
) -> redis::RedisResult<bool> {
    let script = match kind {
        LockKind::Exclusive | LockKind::Fair => &FORCE_UNLOCK,
        LockKind::Read | LockKind::Write => &RW_FORCE_UNLOCK,
        LockKind::Semaphore { .. } => &SEM_FORCE_UNLOCK,
    };
    let keys = joined_values(
        lock_keys(keys, scope_keys),
        [keys.readers(), trace_key(keys, scope_keys)],
    );
    let args = [
        Arg::Text(&scope_keys.wake_prefix),
        Arg::Text(operation),
        Arg::Number(scope_keys.trace_ms),
    ];
    let cmd = script.command(keys, args);
    let reply: ScriptReply = run(script, conn, &cmd).await?;
    match reply.status() {
        unlocked::REMOVED => Ok(true),
        unlocked::WAS_FREE => Ok(false),
        _ => Err(reply.unknown()),
    }
}
