//! The scripts that give a lock back: release, the local hand-over, and force-unlock, for an
//! exclusive (or fair) lock, a read-write lock and a semaphore.

use crate::keys::LockKeys;
use crate::lock_kind::LockKind;
use crate::scopes::ScopeKeys;
use crate::wire::conn::Conn;
use crate::wire::script::{RUNS_OVER_MAXMEMORY, ScriptSpec};
use crate::wire::script_inputs::{Arg, OneArg, script_inputs};
use crate::wire::script_reply::{ScriptReply, reply_statuses};
use crate::wire::scripts::acquire::AcquireTerms;
use crate::wire::scripts::{LockKeyNames, Role};

reply_statuses! {
    /// What a release answers.
    released {
        /// The owner's holds were released as asked.
        RELEASED = 1 => Released { holds_left: u64 },
        /// The owner held nothing.
        NOT_HELD = -1,
    }
}

reply_statuses! {
    /// What a hand-over answers besides [`released::NOT_HELD`].
    handed_over {
        /// Another instance got the lock.
        PASSED = 2 => Passed { server_ms: u64, last_token: u64 },
        /// Nobody else waits: the owner keeps it, with a fresh token block.
        KEPT = 3 => Kept { first_token: u64, reserved: u64 },
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

script_inputs! {
    /// The keys every release of one lock takes first.
    struct ReleaseKeys<'a> {
        keys {
            lock_keys: LockKeyNames<'a>,
            token_counter: &'a str,
        }
        args {}
    }
}

script_inputs! {
    /// The arguments every release for one owner takes: how much it releases, and how long
    /// its trace is kept (see `lua/lib/release_trace.lua`).
    struct ReleaseArgs<'a> {
        keys {}
        args {
            wake_prefix: &'a str,
            owner: &'a str,
            scope: ReleaseScope,
            release_trace_ms: u64,
        }
    }
}

script_inputs! {
    /// What an exclusive (or fair) lock's release takes.
    struct ReleaseInputs<'a> {
        keys {
            release_keys: ReleaseKeys<'a>,
            release_trace: &'a str,
        }
        args { release_args: ReleaseArgs<'a> }
    }
}

script_inputs! {
    /// What [`RELEASE_EACH`] takes once for all its owners.
    struct ReleaseEachInputs<'a> {
        keys { token_counter: &'a str }
        args {
            wake_prefix: &'a str,
            scope: ReleaseScope,
            release_trace_ms: u64,
        }
    }
}

script_inputs! {
    /// What [`RELEASE_EACH`] takes per owner.
    struct ReleaseItem<'a> {
        keys {
            lock_keys: LockKeyNames<'a>,
            release_trace: &'a str,
        }
        args { owner: &'a str }
    }
}

script_inputs! {
    /// What a hand-over takes: the release of `owner`, and the terms of `next_owner`.
    struct HandoverInputs<'a> {
        keys {
            release_keys: ReleaseKeys<'a>,
            release_trace: &'a str,
        }
        args {
            wake_prefix: &'a str,
            owner: &'a str,
            next_owner: &'a str,
            alive_ms: u64,
            lease_ms: u64,
            token_block: u64,
            release_trace_ms: u64,
        }
    }
}

script_inputs! {
    /// What a read-write lock's release takes.
    struct RwReleaseInputs<'a> {
        keys {
            release_keys: ReleaseKeys<'a>,
            readers: &'a str,
            release_trace: &'a str,
        }
        args {
            release_args: ReleaseArgs<'a>,
            role: Role,
            keep: u64,
        }
    }
}

script_inputs! {
    /// What a semaphore's release takes.
    struct SemReleaseInputs<'a> {
        keys {
            release_keys: ReleaseKeys<'a>,
            holders: &'a str,
            release_trace: &'a str,
        }
        args { release_args: ReleaseArgs<'a> }
    }
}

script_inputs! {
    /// What every force-unlock takes: `owner` names the force-unlock, for its trace.
    struct ForceUnlockArgs<'a> {
        keys {}
        args {
            wake_prefix: &'a str,
            owner: &'a str,
            release_trace_ms: u64,
        }
    }
}

script_inputs! {
    /// What a force-unlock of a lock or a read-write lock takes.
    struct ForceUnlockInputs<'a> {
        keys {
            release_keys: ReleaseKeys<'a>,
            readers: &'a str,
            release_trace: &'a str,
        }
        args { unlock_args: ForceUnlockArgs<'a> }
    }
}

script_inputs! {
    /// What a force-unlock of a semaphore takes.
    struct SemForceUnlockInputs<'a> {
        keys {
            release_keys: ReleaseKeys<'a>,
            holders: &'a str,
            release_trace: &'a str,
        }
        args { unlock_args: ForceUnlockArgs<'a> }
    }
}

static RELEASE: ScriptSpec<ReleaseInputs<'static>> = ScriptSpec::new(
    "release.lua",
    include_str!("../lua/release.lua"),
    &[released::ALL],
)
.with_short_reply(released::RELEASED)
.with_function_flags(RUNS_OVER_MAXMEMORY);

/// [`RELEASE`] of every hold of many owners of one scope at once, each of a lock of its own:
/// the keys and argument that differ per lock and owner are given per item, the rest once,
/// and the script's code runs once per item. It answers a table of what [`RELEASE`] answers
/// each.
static RELEASE_EACH: ScriptSpec<ReleaseEachInputs<'static>, ReleaseItem<'static>> =
    ScriptSpec::new(
        "release.lua",
        include_str!("../lua/release.lua"),
        &[released::ALL],
    )
    .with_code_per_item(&["clock", "counter"])
    .with_short_reply(released::RELEASED)
    .with_function_flags(RUNS_OVER_MAXMEMORY);

static HANDOVER: ScriptSpec<HandoverInputs<'static>> = ScriptSpec::new(
    "handover.lua",
    include_str!("../lua/handover.lua"),
    &[released::ALL, handed_over::ALL],
)
.with_function_flags(RUNS_OVER_MAXMEMORY);

static RW_RELEASE: ScriptSpec<RwReleaseInputs<'static>> = ScriptSpec::new(
    "rw_release.lua",
    include_str!("../lua/rw_release.lua"),
    &[released::ALL],
)
.with_function_flags(RUNS_OVER_MAXMEMORY);

static SEM_RELEASE: ScriptSpec<SemReleaseInputs<'static>> = ScriptSpec::new(
    "sem_release.lua",
    include_str!("../lua/sem_release.lua"),
    &[released::ALL],
)
.with_function_flags(RUNS_OVER_MAXMEMORY);

static FORCE_UNLOCK: ScriptSpec<ForceUnlockInputs<'static>> = ScriptSpec::new(
    "force_unlock.lua",
    include_str!("../lua/force_unlock.lua"),
    &[unlocked::ALL],
)
.with_function_flags(RUNS_OVER_MAXMEMORY);

static RW_FORCE_UNLOCK: ScriptSpec<ForceUnlockInputs<'static>> = ScriptSpec::new(
    "rw_force_unlock.lua",
    include_str!("../lua/rw_force_unlock.lua"),
    &[unlocked::ALL],
)
.with_function_flags(RUNS_OVER_MAXMEMORY);

static SEM_FORCE_UNLOCK: ScriptSpec<SemForceUnlockInputs<'static>> = ScriptSpec::new(
    "sem_force_unlock.lua",
    include_str!("../lua/sem_force_unlock.lua"),
    &[unlocked::ALL],
)
.with_function_flags(RUNS_OVER_MAXMEMORY);

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

/// As the release scripts name it.
impl OneArg for ReleaseScope {
    fn arg(&self) -> Arg<'_> {
        Arg::Text(match self {
            ReleaseScope::Partial => "partial",
            ReleaseScope::OneWithin { .. } => "one",
            ReleaseScope::All => "all",
        })
    }
}

impl ReleaseScope {
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

impl<'a> ReleaseKeys<'a> {
    /// The keys of the lock with `keys` in the scope of `scope_keys`.
    fn of(keys: &'a LockKeys, scope_keys: &'a ScopeKeys) -> Self {
        Self {
            lock_keys: LockKeyNames::of(keys),
            token_counter: &scope_keys.tokens_key,
        }
    }
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
    let release_keys = ReleaseKeys::of(keys, scope_keys);
    let release_trace = trace_key(keys, scope_keys);
    let release_args = ReleaseArgs {
        wake_prefix: &scope_keys.wake_prefix,
        owner,
        scope,
        release_trace_ms: scope_keys.trace_ms,
    };
    let reply = match kind {
        LockKind::Exclusive | LockKind::Fair => {
            let cmd = RELEASE.command(&ReleaseInputs {
                release_keys,
                release_trace,
                release_args,
            });
            RELEASE.run(conn, &cmd).await?
        }
        LockKind::Read | LockKind::Write => {
            let cmd = RW_RELEASE.command(&RwReleaseInputs {
                release_keys,
                readers: keys.readers(),
                release_trace,
                release_args,
                role: Role(kind),
                keep: scope.keep(),
            });
            RW_RELEASE.run(conn, &cmd).await?
        }
        LockKind::Semaphore { .. } => {
            let cmd = SEM_RELEASE.command(&SemReleaseInputs {
                release_keys,
                holders: keys.readers(),
                release_trace,
                release_args,
            });
            SEM_RELEASE.run(conn, &cmd).await?
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
    let inputs = ReleaseEachInputs {
        token_counter: &scope_keys.tokens_key,
        wake_prefix: &scope_keys.wake_prefix,
        scope: ReleaseScope::All,
        release_trace_ms: scope_keys.trace_ms,
    };
    let items: Vec<ReleaseItem<'_>> = owners
        .iter()
        .map(|(keys, owner)| ReleaseItem {
            lock_keys: LockKeyNames::of(keys),
            release_trace: trace_key(keys, scope_keys),
            owner,
        })
        .collect();
    let cmd = RELEASE_EACH.command_each(&inputs, &items);
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
        released::RELEASED => {
            let released::Released { holds_left } = reply.values()?;
            Ok(Some(holds_left))
        }
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
    let cmd = HANDOVER.command(&HandoverInputs {
        release_keys: ReleaseKeys::of(keys, scope_keys),
        release_trace: trace_key(keys, scope_keys),
        wake_prefix: &scope_keys.wake_prefix,
        owner,
        next_owner,
        alive_ms: terms.alive_ms,
        lease_ms: terms.lease_ms,
        token_block: terms.block,
        release_trace_ms: scope_keys.trace_ms,
    });
    let reply = HANDOVER.run(conn, &cmd).await?;
    Ok(match reply.status() {
        handed_over::PASSED => {
            let handed_over::Passed {
                server_ms,
                last_token,
            } = reply.values()?;
            HandoverReply::Passed {
                server_ms,
                last_token,
            }
        }
        handed_over::KEPT => {
            let kept: handed_over::Kept = reply.values()?;
            HandoverReply::Kept {
                token: kept.first_token,
                reserved: kept.reserved.max(1),
            }
        }
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
    let inputs = ForceUnlockInputs {
        release_keys: ReleaseKeys::of(keys, scope_keys),
        readers: keys.readers(),
        release_trace: trace_key(keys, scope_keys),
        unlock_args: ForceUnlockArgs {
            wake_prefix: &scope_keys.wake_prefix,
            owner: operation,
            release_trace_ms: scope_keys.trace_ms,
        },
    };
    let reply = match kind {
        LockKind::Exclusive | LockKind::Fair => {
            FORCE_UNLOCK
                .run(conn, &FORCE_UNLOCK.command(&inputs))
                .await?
        }
        LockKind::Read | LockKind::Write => {
            RW_FORCE_UNLOCK
                .run(conn, &RW_FORCE_UNLOCK.command(&inputs))
                .await?
        }
        LockKind::Semaphore { .. } => {
            let cmd = SEM_FORCE_UNLOCK.command(&SemForceUnlockInputs {
                release_keys: inputs.release_keys,
                holders: inputs.readers,
                release_trace: inputs.release_trace,
                unlock_args: inputs.unlock_args,
            });
            SEM_FORCE_UNLOCK.run(conn, &cmd).await?
        }
    };
    match reply.status() {
        unlocked::REMOVED => Ok(true),
        unlocked::WAS_FREE => Ok(false),
        _ => Err(reply.unknown()),
    }
}
