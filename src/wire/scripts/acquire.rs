//! The scripts that take a lock or wait for it: an exclusive (or fair) lock's, a read-write
//! lock's and a semaphore's.

use std::sync::Arc;

use crate::keys::LockKeys;
use crate::lock_kind::LockKind;
use crate::scopes::ScopeKeys;
use crate::wire::conn::Conn;
use crate::wire::script::ScriptSpec;
use crate::wire::script_inputs::{Arg, OneArg, script_inputs, yes_or_no};
use crate::wire::script_reply::{ScriptReply, Status, reply_statuses};
use crate::wire::scripts::{LockKeyNames, Role};

reply_statuses! {
    /// What an acquisition answers.
    acquired {
        /// This owner holds the lock. A short reply gives the first token alone: the lease
        /// and the block are then the ones asked for.
        ACQUIRED = 1 => Acquired {
            /// The first token of the block (0 on a re-entry).
            first_token: u64,
            lease_left_ms: Option<i64>,
            reserved: Option<u64>,
        },
        /// Another owner holds it.
        WAITING = 0 => Waiting {
            /// The holder's lease left.
            lease_left_ms: i64,
            server_ms: u64,
            last_token: u64,
        },
        /// A re-entry found the lock no longer held by this owner.
        NOT_OWNER = -1,
        /// A semaphore held with another permit count.
        PERMITS_MISMATCH = -4 => PermitsMismatch { stored: u64 },
    }
}

reply_statuses! {
    /// What the epoch's check answers for a script that takes or renews a lock.
    epoch_checked {
        /// The client must learn both first.
        EPOCH_CHANGED = -2 => EpochChanged { epoch: u64, longest_lease_ms: u64 },
        /// Redis lost its data; nothing is granted until the quarantine ends.
        QUARANTINED = -3 => Quarantined { left_ms: u64, server_ms: u64 },
    }
}

script_inputs! {
    /// The terms every acquisition takes: the same for every owner that asks alike (see
    /// [`TermArgs::new`]).
    struct TermArgs {
        keys {}
        args {
            lease_ms: u64,
            mode: AcquireMode,
            token_block: u64,
            slow_terms: SlowTerms,
        }
    }
}

/// The terms only an acquisition's slower paths read (a wait in the queue, a check of the
/// epoch), as one argument: `<alive ms> <known epoch> <known longest lease ms> <quarantine ms>
/// <yes|no: a restart keeps every write>`. Redis spends about 1,100 instructions on each
/// argument of every call, and a lock taken at once reads none of these; `lib/slow_terms.lua`
/// splits them where a script goes on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SlowTerms {
    numbers: [u64; 4],
    restart_keeps_writes: bool,
}

impl OneArg for SlowTerms {
    fn arg(&self) -> Arg<'_> {
        Arg::Joined(&self.numbers, yes_or_no(self.restart_keeps_writes))
    }
}

script_inputs! {
    /// The keys every acquisition of one lock takes first.
    struct AcquireKeys<'a> {
        keys {
            lock_keys: LockKeyNames<'a>,
            token_counter: &'a str,
            epoch: &'a str,
        }
        args {}
    }
}

script_inputs! {
    /// The arguments every acquisition for one owner takes first.
    struct AcquireArgs<'a> {
        keys {}
        args {
            wake_prefix: &'a str,
            owner: &'a str,
            terms: TermArgs,
        }
    }
}

script_inputs! {
    /// What an exclusive (or fair) lock's acquisition takes.
    struct AcquireInputs<'a> {
        keys {
            acquire_keys: AcquireKeys<'a>,
            epoch_marker: &'a str,
        }
        args {
            acquire_args: AcquireArgs<'a>,
            lease_within_known: bool,
        }
    }
}

script_inputs! {
    /// What [`ACQUIRE_EACH`] takes once for all its owners.
    struct AcquireEachInputs<'a> {
        keys {
            token_counter: &'a str,
            epoch: &'a str,
            epoch_marker: &'a str,
        }
        args {
            wake_prefix: &'a str,
            terms: TermArgs,
            lease_within_known: bool,
        }
    }
}

script_inputs! {
    /// What [`ACQUIRE_EACH`] takes per owner.
    struct AcquireItem<'a> {
        keys { lock_keys: LockKeyNames<'a> }
        args { owner: &'a str }
    }
}

script_inputs! {
    /// What a read-write lock's acquisition takes.
    struct RwAcquireInputs<'a> {
        keys {
            acquire_keys: AcquireKeys<'a>,
            readers: &'a str,
        }
        args {
            acquire_args: AcquireArgs<'a>,
            role: Role,
        }
    }
}

script_inputs! {
    /// What a semaphore's acquisition takes.
    struct SemAcquireInputs<'a> {
        keys {
            acquire_keys: AcquireKeys<'a>,
            holders: &'a str,
        }
        args {
            acquire_args: AcquireArgs<'a>,
            permits: u64,
            take: u64,
        }
    }
}

const ACQUIRE_STATUSES: &[&[Status]] = &[acquired::ALL, epoch_checked::ALL];

static ACQUIRE: ScriptSpec<AcquireInputs<'static>> = ScriptSpec::new(
    "acquire.lua",
    include_str!("../lua/acquire.lua"),
    ACQUIRE_STATUSES,
)
.with_short_reply(acquired::ACQUIRED);

/// [`ACQUIRE`] for many owners of one scope at once, each on a lock of its own: the keys and
/// argument that differ per lock and owner are given per item, the rest once, and the script's
/// code runs once per item. It answers a table of what [`ACQUIRE`] answers each.
static ACQUIRE_EACH: ScriptSpec<AcquireEachInputs<'static>, AcquireItem<'static>> =
    ScriptSpec::new(
        "acquire.lua",
        include_str!("../lua/acquire.lua"),
        ACQUIRE_STATUSES,
    )
    .with_code_per_item(&["clock", "saves", "epoch_look", "counter"])
    .with_short_reply(acquired::ACQUIRED);

static RW_ACQUIRE: ScriptSpec<RwAcquireInputs<'static>> = ScriptSpec::new(
    "rw_acquire.lua",
    include_str!("../lua/rw_acquire.lua"),
    ACQUIRE_STATUSES,
);

static SEM_ACQUIRE: ScriptSpec<SemAcquireInputs<'static>> = ScriptSpec::new(
    "sem_acquire.lua",
    include_str!("../lua/sem_acquire.lua"),
    ACQUIRE_STATUSES,
);

#[cfg(test)]
pub(super) fn all() -> Vec<&'static dyn crate::wire::script::Described> {
    vec![&ACQUIRE, &ACQUIRE_EACH, &RW_ACQUIRE, &SEM_ACQUIRE]
}

/// What an owner asks of Redis when it takes a lock or waits for one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AcquireTerms {
    /// Lease of a lock taken directly.
    pub(crate) lease_ms: u64,
    /// How long a place in the queue lives without a refresh.
    pub(crate) alive_ms: u64,
    /// Fencing tokens reserved per acquisition: one, plus the local hand-overs allowed.
    pub(crate) block: u64,
    /// Which scripts take the lock.
    pub(crate) kind: LockKind,
}

/// How an acquire attempt may treat the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcquireMode {
    /// Take it, or join (or keep a place in) the queue.
    Wait,
    /// [`AcquireMode::Wait`] for an owner no script has seen yet: it can hold nothing, so
    /// the script does not look for a grant made to it.
    Join,
    /// Take it if free for this owner; never queue.
    Try,
    /// Add a hold for an owner that holds it; never take a free lock.
    Reenter,
    /// A read hold for the owner of a read-write lock's write lock; never waits.
    ReadWithin,
}

/// The mode as the scripts name it.
impl OneArg for AcquireMode {
    fn arg(&self) -> Arg<'_> {
        Arg::Text(match self {
            Self::Wait => "wait",
            Self::Join => "join",
            Self::Try => "try",
            Self::Reenter => "reenter",
            Self::ReadWithin => "within",
        })
    }
}

/// What the acquire script answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    /// This owner holds the lock: the first token of its block (0 on a re-entry), the lease
    /// left, and the tokens reserved from the first on (fewer than asked for when the scope's
    /// counter ran ahead of the clock: fewer local hand-overs).
    Acquired {
        token: u64,
        lease_left_ms: i64,
        reserved: u64,
    },
    /// Another owner holds it (lease left, negative when it has no expiry or is gone); the
    /// server's clock when the script ran, and the last fencing token reserved in the lock's
    /// scope by then (a grant with a token not above it came before this look; 0 when the
    /// owner did not queue).
    Waiting {
        lease_left_ms: i64,
        server_ms: u64,
        last_token: u64,
    },
    /// A re-entry found the lock no longer held by this owner.
    NotOwner,
    /// The server is in another epoch than the client knows, or granted a longer lease in it:
    /// the client must learn both (and, when it knew an earlier epoch, tell its holders that
    /// their locks are gone) first.
    EpochChanged { epoch: u64, longest_lease_ms: u64 },
    /// Redis lost its data and grants no lock until its restart quarantine ends (this much
    /// later); the server's clock when the script ran. Nothing was queued.
    Quarantined { left_ms: u64, server_ms: u64 },
    /// The semaphore is held with another permit count than this client's (the one Redis
    /// holds); nothing was taken or queued.
    PermitsMismatch { stored: u64 },
}

/// What the server's epoch is to a client: the one it knows and the longest lease it knows
/// was granted in it, their marker (see `lua/lib/epoch.lua`), the quarantine it starts when
/// it finds the epoch missing, and whether a restart of the server loses no write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KnownEpoch<'a> {
    pub(crate) key: &'a str,
    /// 0 when the client has not seen one yet.
    pub(crate) known: u64,
    pub(crate) known_lease_ms: u64,
    pub(crate) marker: Arc<str>,
    pub(crate) quarantine_ms: u64,
    /// The server fsyncs every write (`appendfsync always`): a restart is no loss.
    pub(crate) keeps_writes: bool,
}

impl TermArgs {
    /// The terms of an acquisition with `terms`, in `mode`, by a client that knows `epoch`.
    fn new(terms: &AcquireTerms, mode: AcquireMode, epoch: &KnownEpoch<'_>) -> Self {
        Self {
            lease_ms: terms.lease_ms,
            mode,
            token_block: terms.block,
            slow_terms: SlowTerms {
                numbers: [
                    terms.alive_ms,
                    epoch.known,
                    epoch.known_lease_ms,
                    epoch.quarantine_ms,
                ],
                restart_keeps_writes: epoch.keeps_writes,
            },
        }
    }
}

pub(crate) async fn acquire(
    conn: &mut Conn,
    keys: &LockKeys,
    scope_keys: &ScopeKeys,
    owner: &str,
    terms: &AcquireTerms,
    mode: AcquireMode,
    epoch: &KnownEpoch<'_>,
) -> redis::RedisResult<AcquireReply> {
    let acquire_keys = AcquireKeys {
        lock_keys: LockKeyNames::of(keys),
        token_counter: &scope_keys.tokens_key,
        epoch: epoch.key,
    };
    let acquire_args = AcquireArgs {
        wake_prefix: &scope_keys.wake_prefix,
        owner,
        terms: TermArgs::new(terms, mode, epoch),
    };
    let reply = match terms.kind {
        LockKind::Exclusive | LockKind::Fair => {
            let cmd = ACQUIRE.command(&AcquireInputs {
                acquire_keys,
                epoch_marker: &epoch.marker,
                acquire_args,
                lease_within_known: epoch.known_lease_ms >= terms.lease_ms,
            });
            ACQUIRE.run(conn, &cmd).await?
        }
        LockKind::Read | LockKind::Write => {
            let cmd = RW_ACQUIRE.command(&RwAcquireInputs {
                acquire_keys,
                readers: keys.readers(),
                acquire_args,
                role: Role(terms.kind),
            });
            RW_ACQUIRE.run(conn, &cmd).await?
        }
        LockKind::Semaphore { permits, take } => {
            let cmd = SEM_ACQUIRE.command(&SemAcquireInputs {
                acquire_keys,
                holders: keys.readers(),
                acquire_args,
                permits: permits.into(),
                take: take.into(),
            });
            SEM_ACQUIRE.run(conn, &cmd).await?
        }
    };
    let lease_ms = i64::try_from(terms.lease_ms).unwrap_or(i64::MAX);
    acquire_reply(&reply, lease_ms, terms.block)
}

/// One run of the acquire script of an exclusive (or fair) lock for each of `owners` (each on
/// a lock of its own in the scope of `scope_keys`), all with `terms` and in `mode`: the reply for
/// each, in their order, or the error of the whole call.
pub(crate) async fn acquire_each(
    conn: &mut Conn,
    owners: &[(&LockKeys, &str)],
    scope_keys: &ScopeKeys,
    terms: &AcquireTerms,
    mode: AcquireMode,
    epoch: &KnownEpoch<'_>,
) -> redis::RedisResult<Vec<redis::RedisResult<AcquireReply>>> {
    debug_assert!(
        matches!(terms.kind, LockKind::Exclusive | LockKind::Fair),
        "only an exclusive or fair lock's acquisitions are sent together"
    );
    let inputs = AcquireEachInputs {
        token_counter: &scope_keys.tokens_key,
        epoch: epoch.key,
        epoch_marker: &epoch.marker,
        wake_prefix: &scope_keys.wake_prefix,
        terms: TermArgs::new(terms, mode, epoch),
        lease_within_known: epoch.known_lease_ms >= terms.lease_ms,
    };
    let items: Vec<AcquireItem<'_>> = owners
        .iter()
        .map(|(keys, owner)| AcquireItem {
            lock_keys: LockKeyNames::of(keys),
            owner,
        })
        .collect();
    let cmd = ACQUIRE_EACH.command_each(&inputs, &items);
    let replies: Vec<redis::Value> = ACQUIRE_EACH.lua().run(conn, &cmd).await?;
    if replies.len() != owners.len() {
        return Err(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "acquire.lua answered another count of items than it was given",
        )));
    }
    let lease_ms = i64::try_from(terms.lease_ms).unwrap_or(i64::MAX);
    Ok(replies
        .into_iter()
        .map(|value| {
            let reply = ScriptReply::read(ACQUIRE_EACH.file, value, ACQUIRE_EACH.short_reply)?;
            acquire_reply(&reply, lease_ms, terms.block)
        })
        .collect())
}

/// `lease_ms`, the lease asked for, is what a lock taken at once has left, and `block`, the
/// tokens asked for, what it reserved.
fn acquire_reply(
    reply: &ScriptReply,
    lease_ms: i64,
    block: u64,
) -> redis::RedisResult<AcquireReply> {
    Ok(match reply.status() {
        acquired::ACQUIRED => {
            let acquired: acquired::Acquired = reply.values()?;
            AcquireReply::Acquired {
                token: acquired.first_token,
                lease_left_ms: acquired.lease_left_ms.unwrap_or(lease_ms),
                reserved: acquired.reserved.unwrap_or(block).max(1),
            }
        }
        acquired::WAITING => {
            let acquired::Waiting {
                lease_left_ms,
                server_ms,
                last_token,
            } = reply.values()?;
            AcquireReply::Waiting {
                lease_left_ms,
                server_ms,
                last_token,
            }
        }
        acquired::NOT_OWNER => AcquireReply::NotOwner,
        acquired::PERMITS_MISMATCH => {
            let acquired::PermitsMismatch { stored } = reply.values()?;
            AcquireReply::PermitsMismatch { stored }
        }
        epoch_checked::EPOCH_CHANGED => {
            let epoch_checked::EpochChanged {
                epoch,
                longest_lease_ms,
            } = reply.values()?;
            AcquireReply::EpochChanged {
                epoch,
                longest_lease_ms,
            }
        }
        epoch_checked::QUARANTINED => {
            let epoch_checked::Quarantined { left_ms, server_ms } = reply.values()?;
            AcquireReply::Quarantined { left_ms, server_ms }
        }
        _ => return Err(reply.unknown()),
    })
}
