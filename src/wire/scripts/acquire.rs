//! The scripts that take a lock or wait for it: an exclusive (or fair) lock's, a read-write
//! lock's and a semaphore's.

use std::sync::Arc;

use crate::keys::LockKeys;
use crate::lock_kind::LockKind;
use crate::scopes::ScopeKeys;
use crate::wire::conn::Conn;
use crate::wire::script::{Arg, Each, ScriptSpec, joined, joined_values, reply_statuses};
use crate::wire::scripts::reply::{ScriptReply, run};
use crate::wire::scripts::{LOCK_KEYS, lock_keys, rw_role};

reply_statuses! {
    /// What an acquisition answers.
    acquired {
        /// This owner holds the lock: `{ACQUIRED, first token, lease left ms}`.
        ACQUIRED = 1,
        /// Another owner holds it: `{WAITING, holder's lease left ms, server ms, last token}`.
        WAITING = 0,
        /// A re-entry found the lock no longer held by this owner.
        NOT_OWNER = -1,
        /// A semaphore held with another permit count: `{PERMITS_MISMATCH, stored}`.
        PERMITS_MISMATCH = -4,
    }
}

reply_statuses! {
    /// What the epoch's check answers for a script that takes or renews a lock.
    epoch_checked {
        /// `{EPOCH_CHANGED, epoch, longest lease ms}`: the client must learn both first.
        EPOCH_CHANGED = -2,
        /// `{QUARANTINED, quarantine left ms, server ms}`.
        QUARANTINED = -3,
    }
}

/// The terms every acquisition takes after its wake prefix and owner, in their order: the
/// same for every owner that asks alike (see [`terms_args`]).
const TERMS_ARGS: [&str; 8] = [
    "LEASE_MS",
    "MODE",
    "TOKEN_BLOCK",
    "KNOWN_LONGEST_LEASE_MS",
    "ALIVE_MS",
    "KNOWN_EPOCH",
    "QUARANTINE_MS",
    "RESTART_KEEPS_WRITES",
];

/// The arguments every acquisition takes, in their order.
const ACQUIRE_ARGS: [&str; 10] = joined(["WAKE_PREFIX", "OWNER"], TERMS_ARGS);

const ACQUIRE_STATUSES: &[&[(&str, i64)]] = &[acquired::ALL, epoch_checked::ALL];

static ACQUIRE: ScriptSpec<7, 11> = ScriptSpec::new(
    "acquire.lua",
    include_str!("../lua/acquire.lua"),
    joined(LOCK_KEYS, ["EPOCH", "EPOCH_MARKER"]),
    joined(ACQUIRE_ARGS, ["LEASE_WITHIN_KNOWN"]),
    ACQUIRE_STATUSES,
)
.with_short_reply(acquired::ACQUIRED);

/// [`ACQUIRE`] for many owners of one scope at once, each on a lock of its own: the keys and
/// argument that differ per lock and owner are given per item, the rest once, and the script's
/// code runs once per item. It answers a table of what [`ACQUIRE`] answers each.
static ACQUIRE_EACH: ScriptSpec<3, 10> = ScriptSpec::new(
    "acquire.lua",
    include_str!("../lua/acquire.lua"),
    ["TOKEN_COUNTER", "EPOCH", "EPOCH_MARKER"],
    joined(
        joined::<1, 8, 9>(["WAKE_PREFIX"], TERMS_ARGS),
        ["LEASE_WITHIN_KNOWN"],
    ),
    ACQUIRE_STATUSES,
)
.with_each(Each {
    keys: &["LOCK", "LAST_GRANT", "QUEUE", "WAITER_TERMS"],
    args: &["OWNER"],
})
.with_code_per_item(&["clock", "saves", "counter"])
.with_short_reply(acquired::ACQUIRED);

static RW_ACQUIRE: ScriptSpec<7, 11> = ScriptSpec::new(
    "rw_acquire.lua",
    include_str!("../lua/rw_acquire.lua"),
    joined(LOCK_KEYS, ["EPOCH", "READERS"]),
    joined(ACQUIRE_ARGS, ["ROLE"]),
    ACQUIRE_STATUSES,
);

static SEM_ACQUIRE: ScriptSpec<7, 12> = ScriptSpec::new(
    "sem_acquire.lua",
    include_str!("../lua/sem_acquire.lua"),
    joined(LOCK_KEYS, ["EPOCH", "HOLDERS"]),
    joined(ACQUIRE_ARGS, ["PERMITS", "TAKE"]),
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

impl AcquireMode {
    /// The mode as the scripts name it.
    fn as_str(self) -> &'static str {
        match self {
            Self::Wait => "wait",
            Self::Join => "join",
            Self::Try => "try",
            Self::Reenter => "reenter",
            Self::ReadWithin => "within",
        }
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

impl KnownEpoch<'_> {
    /// `RESTART_KEEPS_WRITES` as the scripts take it.
    pub(crate) fn restart_keeps_writes(&self) -> Arg<'static> {
        Arg::Text(if self.keeps_writes { "yes" } else { "no" })
    }
}

/// The values of [`TERMS_ARGS`].
fn terms_args<'a>(terms: &AcquireTerms, mode: AcquireMode, epoch: &KnownEpoch<'_>) -> [Arg<'a>; 8] {
    [
        Arg::Number(terms.lease_ms),
        Arg::Text(mode.as_str()),
        Arg::Number(terms.block),
        Arg::Number(epoch.known_lease_ms),
        Arg::Number(terms.alive_ms),
        Arg::Number(epoch.known),
        Arg::Number(epoch.quarantine_ms),
        epoch.restart_keeps_writes(),
    ]
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
    let lock_keys = lock_keys(keys, scope_keys);
    let args: [Arg<'_>; 10] = joined_values(
        [Arg::Text(&scope_keys.wake_prefix), Arg::Text(owner)],
        terms_args(terms, mode, epoch),
    );
    let reply = match terms.kind {
        LockKind::Exclusive | LockKind::Fair => {
            let keys = joined_values(lock_keys, [epoch.key, &epoch.marker]);
            let within = epoch.known_lease_ms >= terms.lease_ms;
            let within = Arg::Text(if within { "yes" } else { "no" });
            let cmd = ACQUIRE.command(keys, joined_values(args, [within]));
            run(&ACQUIRE, conn, &cmd).await?
        }
        LockKind::Read | LockKind::Write => {
            let keys = joined_values(lock_keys, [epoch.key, keys.readers()]);
            let role = Arg::Text(rw_role(terms.kind));
            let cmd = RW_ACQUIRE.command(keys, joined_values(args, [role]));
            run(&RW_ACQUIRE, conn, &cmd).await?
        }
        LockKind::Semaphore { permits, take } => {
            let keys = joined_values(lock_keys, [epoch.key, keys.readers()]);
            let counts = [Arg::Number(permits.into()), Arg::Number(take.into())];
            let cmd = SEM_ACQUIRE.command(keys, joined_values(args, counts));
            run(&SEM_ACQUIRE, conn, &cmd).await?
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
    let within = epoch.known_lease_ms >= terms.lease_ms;
    let args = joined_values(
        joined_values::<_, 1, 8, 9>(
            [Arg::Text(&scope_keys.wake_prefix)],
            terms_args(terms, mode, epoch),
        ),
        [Arg::Text(if within { "yes" } else { "no" })],
    );
    let items: Vec<([&str; 4], [Arg<'_>; 1])> = owners
        .iter()
        .map(|(keys, owner)| {
            let item_keys = [
                keys.hash(),
                keys.last_grant(),
                keys.queue(),
                keys.waiter_terms(),
            ];
            (item_keys, [Arg::Text(owner)])
        })
        .collect();
    let fixed_keys = [scope_keys.tokens_key.as_str(), epoch.key, &epoch.marker];
    let cmd = ACQUIRE_EACH.command_each(fixed_keys, args, &items);
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
        acquired::ACQUIRED => AcquireReply::Acquired {
            token: reply.non_negative(0),
            lease_left_ms: reply.value_or(1, lease_ms),
            reserved: u64::try_from(reply.value_or(2, block as i64)).unwrap_or(1),
        },
        acquired::WAITING => AcquireReply::Waiting {
            lease_left_ms: reply.value(0),
            server_ms: reply.non_negative(1),
            last_token: reply.non_negative(2),
        },
        acquired::NOT_OWNER => AcquireReply::NotOwner,
        acquired::PERMITS_MISMATCH => AcquireReply::PermitsMismatch {
            stored: reply.non_negative(0),
        },
        epoch_checked::EPOCH_CHANGED => AcquireReply::EpochChanged {
            epoch: reply.non_negative(0),
            longest_lease_ms: reply.non_negative(1),
        },
        epoch_checked::QUARANTINED => AcquireReply::Quarantined {
            left_ms: reply.non_negative(0),
            server_ms: reply.non_negative(1),
        },
        _ => return Err(reply.unknown()),
    })
}
