//! The Lua scripts, run with EVALSHA (`lua.rs` reloads them on NOSCRIPT). Each starts with
//! `lua/migration.lua`, which reads its keys and arguments (in a migrating cluster slot, as
//! `migration.rs` passes them). They share the
//! server clock of `lua/clock.lua`; the scripts that take a lock share `lua/tokens.lua`, those
//! that hand a lock over the queue functions of `lua/queue.lua` (and, with the heartbeat, the
//! queue's expiry of `lua/queue_expiry.lua`), and those that take or renew one the epoch
//! check of `lua/epoch.lua`; the acquisitions read the terms of waiting and of the epoch with
//! `lua/acquire_terms.lua`. A read-write lock's scripts (`rw_*.lua`) also share the state
//! functions of `lua/rw.lua`, and a semaphore's (`sem_*.lua`) those of `lua/sem.lua`. An
//! exclusive lock's acquire and release start with their free-lock part (`*_free.lua`),
//! placed before the queue's functions (and the acquire's before its terms and the epoch's
//! functions): Lua creates a function each time a script runs past its definition, and most
//! acquisitions and releases find nobody queued and the epoch they know, and return before.

use std::sync::Arc;

use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, Value};

use crate::keys::LockKeys;
use crate::kind::LockKind;
use crate::slots::{Names, slot_of};
use crate::wire::args_room::ArgsRoom;
use crate::wire::conn::Conn;
use crate::wire::joined_numbers::{JOINED, JoinedNumbers};
use crate::wire::lock_command::{ExtraKeys, evalsha};
use crate::wire::lua::Lua;

static ACQUIRE: Lua = Lua::new(concat!(
    include_str!("lua/migration.lua"),
    include_str!("lua/clock.lua"),
    include_str!("lua/tokens.lua"),
    include_str!("lua/acquire_free.lua"),
    include_str!("lua/acquire_terms.lua"),
    include_str!("lua/epoch.lua"),
    include_str!("lua/acquire_checked.lua"),
    include_str!("lua/queue_expiry.lua"),
    include_str!("lua/queue.lua"),
    include_str!("lua/acquire.lua")
));
static RELEASE: Lua = Lua::new(concat!(
    include_str!("lua/migration.lua"),
    include_str!("lua/release_free.lua"),
    include_str!("lua/clock.lua"),
    include_str!("lua/tokens.lua"),
    include_str!("lua/queue_expiry.lua"),
    include_str!("lua/queue.lua"),
    include_str!("lua/release.lua")
));
static FORCE_UNLOCK: Lua = Lua::new(concat!(
    include_str!("lua/migration.lua"),
    include_str!("lua/clock.lua"),
    include_str!("lua/tokens.lua"),
    include_str!("lua/queue_expiry.lua"),
    include_str!("lua/queue.lua"),
    include_str!("lua/force_unlock.lua")
));
static RW_ACQUIRE: Lua = Lua::new(concat!(
    include_str!("lua/migration.lua"),
    include_str!("lua/clock.lua"),
    include_str!("lua/tokens.lua"),
    include_str!("lua/queue_expiry.lua"),
    include_str!("lua/queue.lua"),
    include_str!("lua/epoch.lua"),
    include_str!("lua/rw.lua"),
    include_str!("lua/acquire_terms.lua"),
    include_str!("lua/rw_acquire.lua")
));
static RW_RELEASE: Lua = Lua::new(concat!(
    include_str!("lua/migration.lua"),
    include_str!("lua/clock.lua"),
    include_str!("lua/tokens.lua"),
    include_str!("lua/queue_expiry.lua"),
    include_str!("lua/queue.lua"),
    include_str!("lua/rw.lua"),
    include_str!("lua/rw_release.lua")
));
static RW_FORCE_UNLOCK: Lua = Lua::new(concat!(
    include_str!("lua/migration.lua"),
    include_str!("lua/clock.lua"),
    include_str!("lua/tokens.lua"),
    include_str!("lua/queue_expiry.lua"),
    include_str!("lua/queue.lua"),
    include_str!("lua/rw.lua"),
    include_str!("lua/rw_force_unlock.lua")
));
static SEM_ACQUIRE: Lua = Lua::new(concat!(
    include_str!("lua/migration.lua"),
    include_str!("lua/clock.lua"),
    include_str!("lua/tokens.lua"),
    include_str!("lua/queue_expiry.lua"),
    include_str!("lua/queue.lua"),
    include_str!("lua/epoch.lua"),
    include_str!("lua/sem.lua"),
    include_str!("lua/acquire_terms.lua"),
    include_str!("lua/sem_acquire.lua")
));
static SEM_RELEASE: Lua = Lua::new(concat!(
    include_str!("lua/migration.lua"),
    include_str!("lua/clock.lua"),
    include_str!("lua/tokens.lua"),
    include_str!("lua/queue_expiry.lua"),
    include_str!("lua/queue.lua"),
    include_str!("lua/sem.lua"),
    include_str!("lua/sem_release.lua")
));
static SEM_FORCE_UNLOCK: Lua = Lua::new(concat!(
    include_str!("lua/migration.lua"),
    include_str!("lua/clock.lua"),
    include_str!("lua/tokens.lua"),
    include_str!("lua/queue_expiry.lua"),
    include_str!("lua/queue.lua"),
    include_str!("lua/sem.lua"),
    include_str!("lua/sem_force_unlock.lua")
));
static RENEW: Lua = Lua::new(concat!(
    include_str!("lua/migration.lua"),
    include_str!("lua/clock.lua"),
    include_str!("lua/epoch.lua"),
    include_str!("lua/renew.lua")
));

static EPOCH_WAIVE: Lua = Lua::new(concat!(
    include_str!("lua/migration.lua"),
    include_str!("lua/clock.lua"),
    include_str!("lua/epoch_waive.lua")
));

static HEARTBEAT: Lua = Lua::new(concat!(
    include_str!("lua/migration.lua"),
    include_str!("lua/clock.lua"),
    include_str!("lua/queue_expiry.lua"),
    include_str!("lua/heartbeat.lua")
));

/// What an owner asks of Redis when it takes a lock or waits for one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Terms {
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

/// What the acquire script answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    /// This owner holds the lock: the first token of its block (0 on a re-entry) and the
    /// lease left.
    Acquired { token: u64, lease_left_ms: i64 },
    /// Another owner holds it (lease left, negative when it has no expiry or is gone); the
    /// server's clock when the script ran.
    Waiting { lease_left_ms: i64, server_ms: u64 },
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
/// was granted in it, their marker (see `lua/epoch.lua`), and the quarantine it starts when
/// it finds the epoch missing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EpochTerms<'a> {
    pub(crate) key: &'a str,
    /// 0 when the client has not seen one yet.
    pub(crate) known: u64,
    pub(crate) known_lease_ms: u64,
    pub(crate) marker: Arc<str>,
    pub(crate) quarantine_ms: u64,
}

/// What a renewal answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RenewReply {
    /// Per lock, whether it is still held (and was renewed).
    Renewed(Vec<bool>),
    /// The server is in another epoch (every lock of the earlier one is gone), or granted a
    /// longer lease in it: the client must learn both.
    EpochChanged { epoch: u64, longest_lease_ms: u64 },
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
    /// Another instance got the lock; the next owner is queued behind it (server clock).
    Passed { server_ms: u64 },
    /// Nobody else waits: still held by the same owner, with a fresh token block.
    Kept { token: u64 },
    /// The owner no longer held the lock.
    NotOwner,
}

fn with_terms(cmd: &mut Cmd, terms: &Terms) {
    cmd.arg(terms.alive_ms).arg(terms.lease_ms).arg(terms.block);
}

/// The script that takes or waits for a lock of `kind`.
fn acquire_script(kind: LockKind) -> &'static Lua {
    match kind {
        LockKind::Exclusive | LockKind::Fair => &ACQUIRE,
        LockKind::Read | LockKind::Write => &RW_ACQUIRE,
        LockKind::Semaphore { .. } => &SEM_ACQUIRE,
    }
}

/// The script that releases a lock of `kind`.
fn release_script(kind: LockKind) -> &'static Lua {
    match kind {
        LockKind::Exclusive | LockKind::Fair => &RELEASE,
        LockKind::Read | LockKind::Write => &RW_RELEASE,
        LockKind::Semaphore { .. } => &SEM_RELEASE,
    }
}

/// The script that removes a lock of `kind` whoever holds it.
fn force_unlock_script(kind: LockKind) -> &'static Lua {
    match kind {
        LockKind::Exclusive | LockKind::Fair => &FORCE_UNLOCK,
        LockKind::Read | LockKind::Write => &RW_FORCE_UNLOCK,
        LockKind::Semaphore { .. } => &SEM_FORCE_UNLOCK,
    }
}

/// The role a read-write lock's scripts are told, after their other arguments.
fn rw_role(kind: LockKind) -> Option<&'static str> {
    match kind {
        LockKind::Read => Some("read"),
        LockKind::Write => Some("write"),
        LockKind::Exclusive | LockKind::Fair | LockKind::Semaphore { .. } => None,
    }
}

pub(crate) async fn acquire(
    conn: &mut Conn,
    keys: &LockKeys,
    names: &Names,
    owner: &str,
    terms: &Terms,
    mode: AcquireMode,
    epoch: &EpochTerms<'_>,
) -> redis::RedisResult<AcquireReply> {
    let script = acquire_script(terms.kind);
    let extra = ExtraKeys::acquiring(terms.kind, epoch.key, &epoch.marker);
    let mode = match mode {
        AcquireMode::Wait => "wait",
        AcquireMode::Join => "join",
        AcquireMode::Try => "try",
        AcquireMode::Reenter => "reenter",
        AcquireMode::ReadWithin => "within",
    };
    let role = rw_role(terms.kind);
    let semaphore = match terms.kind {
        LockKind::Semaphore { permits, take } => Some((permits, take)),
        _ => None,
    };
    // The lease, the token block, the longest lease known and a semaphore's two counts; the
    // terms of waiting and of the epoch, which a lock taken at once never reads, in one
    // argument (see `lua/acquire_terms.lua`).
    let numbers = 3 + if semaphore.is_some() { 2 } else { 0 };
    let waiting_and_epoch = JoinedNumbers::new([
        terms.alive_ms,
        terms.lease_ms,
        epoch.known,
        epoch.quarantine_ms,
    ]);
    let tail = ArgsRoom::NONE
        .words([owner, mode])
        .words(role)
        .numbers(numbers)
        .joined_numbers(JOINED);
    let mut cmd = evalsha(script, keys, extra, names, tail);
    cmd.arg(owner)
        .arg(terms.lease_ms)
        .arg(mode)
        .arg(terms.block)
        .arg(epoch.known_lease_ms)
        .arg(waiting_and_epoch.as_bytes());
    if let Some(role) = role {
        cmd.arg(role);
    }
    if let Some((permits, take)) = semaphore {
        cmd.arg(permits).arg(take);
    }
    let lease_ms = i64::try_from(terms.lease_ms).unwrap_or(i64::MAX);
    let reply = script.run(conn, &cmd).await?;
    let (status, first, second) = figures(reply, |token| (1, token, lease_ms))?;
    Ok(match status {
        -4 => AcquireReply::PermitsMismatch {
            stored: first.max(0) as u64,
        },
        -2 => AcquireReply::EpochChanged {
            epoch: first.max(0) as u64,
            longest_lease_ms: second.max(0) as u64,
        },
        -3 => AcquireReply::Quarantined {
            left_ms: first.max(0) as u64,
            server_ms: second.max(0) as u64,
        },
        1 => AcquireReply::Acquired {
            token: first.max(0) as u64,
            lease_left_ms: second,
        },
        0 => AcquireReply::Waiting {
            lease_left_ms: first,
            server_ms: second.max(0) as u64,
        },
        _ => AcquireReply::NotOwner,
    })
}

/// Returns the owner's remaining hold count, or `None` when it held nothing.
pub(crate) async fn release(
    conn: &mut Conn,
    keys: &LockKeys,
    kind: LockKind,
    names: &Names,
    owner: &str,
    scope: ReleaseScope,
) -> redis::RedisResult<Option<u64>> {
    let script = release_script(kind);
    let scope = match scope {
        ReleaseScope::One => "one",
        ReleaseScope::All => "all",
    };
    let role = rw_role(kind);
    let tail = ArgsRoom::NONE.words([owner, scope]).words(role);
    let mut cmd = evalsha(script, keys, ExtraKeys::of(kind, None), names, tail);
    cmd.arg(owner).arg(scope);
    if let Some(role) = role {
        cmd.arg(role);
    }
    let reply = script.run(conn, &cmd).await?;
    let (left, _, _) = figures(reply, |left| (left, 0, 0))?;
    Ok(u64::try_from(left).ok())
}

/// The three figures a lock script answers with. A free lock's part of a script answers with
/// the one figure that varies, as an integer (cheaper for Redis to build and send than a
/// table): `single` gives the three it stands for.
fn figures(
    reply: Value,
    single: impl FnOnce(i64) -> (i64, i64, i64),
) -> redis::RedisResult<(i64, i64, i64)> {
    match reply {
        Value::Int(figure) => Ok(single(figure)),
        reply => Ok(redis::from_redis_value(reply)?),
    }
}

/// Releases the last hold of `owner` while `next_owner`, a task of the same instance, waits.
pub(crate) async fn handoff(
    conn: &mut Conn,
    keys: &LockKeys,
    names: &Names,
    owner: &str,
    next_owner: &str,
    terms: &Terms,
) -> redis::RedisResult<HandoffReply> {
    // The three terms and the lease.
    let tail = ArgsRoom::NONE
        .words([owner, "handoff", next_owner])
        .numbers(4);
    let mut cmd = evalsha(
        &RELEASE,
        keys,
        ExtraKeys::of(LockKind::Exclusive, None),
        names,
        tail,
    );
    cmd.arg(owner).arg("handoff").arg(next_owner);
    with_terms(&mut cmd, terms);
    cmd.arg(terms.lease_ms);
    let (left, outcome, value): (i64, i64, i64) = RELEASE.run(conn, &cmd).await?;
    Ok(match (left, outcome) {
        (-1, _) => HandoffReply::NotOwner,
        (_, 2) => HandoffReply::Kept {
            token: value.max(0) as u64,
        },
        _ => HandoffReply::Passed {
            server_ms: value.max(0) as u64,
        },
    })
}

/// Renews `(keys, owner)` pairs in one call, after checking the epoch; answers per pair
/// whether it is still held. With no pairs, only checks the epoch.
pub(crate) async fn renew(
    conn: &mut Conn,
    locks: &[(&LockKeys, &str)],
    lease_ms: u64,
    epoch: &EpochTerms<'_>,
) -> redis::RedisResult<RenewReply> {
    let mut cmd = RENEW.evalsha(1 + 2 * locks.len());
    cmd.arg(epoch.key);
    for (keys, _) in locks {
        cmd.arg(keys.hash()).arg(keys.readers());
    }
    cmd.arg(lease_ms)
        .arg(epoch.known)
        .arg(epoch.quarantine_ms)
        .arg(epoch.known_lease_ms);
    for (_, owner) in locks {
        cmd.arg(*owner);
    }
    let reply: Vec<i64> = RENEW.run(conn, &cmd).await?;
    Ok(match reply.split_first() {
        Some((0, renewed)) => RenewReply::Renewed(renewed.iter().map(|r| *r == 1).collect()),
        Some((epoch, rest)) => RenewReply::EpochChanged {
            epoch: (*epoch).max(0) as u64,
            longest_lease_ms: rest.first().map_or(0, |lease| (*lease).max(0) as u64),
        },
        None => RenewReply::Renewed(Vec::new()),
    })
}

/// Extends the liveness of `(keys, owner)` places in their queues in one call; answers per
/// place whether it is still queued.
pub(crate) async fn heartbeat(
    conn: &mut Conn,
    places: &[(&LockKeys, &str)],
    alive_ms: u64,
) -> redis::RedisResult<Vec<bool>> {
    let mut cmd = HEARTBEAT.evalsha(2 * places.len());
    for (keys, _) in places {
        cmd.arg(keys.queue()).arg(keys.waiters());
    }
    cmd.arg(alive_ms);
    for (_, owner) in places {
        cmd.arg(*owner);
    }
    let kept: Vec<i64> = HEARTBEAT.run(conn, &cmd).await?;
    Ok(kept.into_iter().map(|kept| kept == 1).collect())
}

pub(crate) async fn force_unlock(
    conn: &mut Conn,
    keys: &LockKeys,
    kind: LockKind,
    names: &Names,
) -> redis::RedisResult<bool> {
    let script = force_unlock_script(kind);
    // Every kind removes the readers' index too: a plain lock's name may be read-held.
    let extra = ExtraKeys {
        epoch: None,
        marker: None,
        readers: true,
    };
    let cmd = evalsha(script, keys, extra, names, ArgsRoom::NONE);
    let removed: i64 = script.run(conn, &cmd).await?;
    Ok(removed == 1)
}

/// Waives the restart quarantine of the epoch at `epoch_key` (or gives a server without an
/// epoch its first one, without a quarantine); returns whether one was waived.
pub(crate) async fn waive_quarantine(conn: &mut Conn, epoch_key: &str) -> redis::RedisResult<bool> {
    let mut cmd = EPOCH_WAIVE.evalsha(1);
    cmd.arg(epoch_key);
    let waived: i64 = EPOCH_WAIVE.run(conn, &cmd).await?;
    Ok(waived == 1)
}

/// A write of this connection's own to `tokens_key` (`INCRBY 0`, which changes nothing but
/// is replicated), then `WAIT replicas timeout_ms`, in one pipeline on one connection (on a
/// cluster, to the master of the key's slot): how many replicas acknowledged every write the
/// node had made before that write. Since Redis 7.2 (and on Valkey) WAIT counts only what
/// its own connection wrote, so a grant written by another client, or a write sent on a
/// connection replaced since, is covered only by a write sent right before the WAIT.
pub(crate) async fn write_and_wait_for_replicas(
    conn: &mut Conn,
    tokens_key: &str,
    replicas: u32,
    timeout_ms: u64,
) -> redis::RedisResult<u32> {
    let mut pipe = redis::pipe();
    pipe.cmd("INCRBY").arg(tokens_key).arg(0);
    pipe.cmd("WAIT").arg(replicas).arg(timeout_ms);
    let replies = match conn {
        Conn::Server(conn) => pipe.query_async::<Vec<Value>>(conn).await?,
        Conn::Cluster(conn) => {
            let node = Route::new(slot_of(tokens_key), SlotAddr::Master);
            conn.route_pipeline(pipe, 0, 2, SingleNodeRoutingInfo::SpecificNode(node))
                .await?
        }
    };
    match <[Value; 2]>::try_from(replies) {
        // An error reply (the node is a replica now, or a failover unblocked the WAIT) is an
        // error, not a count.
        Ok([Value::ServerError(err), _] | [_, Value::ServerError(err)]) => Err(err.into()),
        Ok([_, acked]) => Ok(redis::from_redis_value(acked)?),
        Err(replies) => Err(redis::RedisError::from((
            redis::ErrorKind::Client,
            "a write and WAIT answered with another number of replies",
            format!("{replies:?}"),
        ))),
    }
}
