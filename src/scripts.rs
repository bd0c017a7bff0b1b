//! The Lua scripts, run with EVALSHA (redis-rs reloads them on NOSCRIPT).

use std::sync::LazyLock;

use redis::Script;
use redis::aio::MultiplexedConnection;

use crate::keys::LockKeys;

static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/acquire.lua")));
static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/release.lua")));
static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("scripts/renew.lua")));
static FORCE_UNLOCK: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/force_unlock.lua")));

/// What the acquire script answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    /// Taken; the fencing token (0 on a re-entry).
    Acquired(u64),
    /// Another owner holds it for this many more milliseconds (negative: no expiry or gone).
    Held(i64),
    /// A re-entry found the lock no longer held by this owner.
    NotOwner,
}

/// How many holds a release drops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseScope {
    /// One hold (the normal release of one guard).
    One,
    /// Every hold of the owner (an abandoned acquisition, or shutdown).
    All,
}

pub(crate) async fn acquire(
    conn: &mut MultiplexedConnection,
    keys: &LockKeys,
    owner: &str,
    lease_ms: u64,
    reenter_only: bool,
) -> redis::RedisResult<AcquireReply> {
    let (status, value): (i64, i64) = ACQUIRE
        .key(keys.hash())
        .key(keys.fence())
        .arg(lease_ms)
        .arg(owner)
        .arg(if reenter_only { "1" } else { "0" })
        .invoke_async(conn)
        .await?;
    Ok(match status {
        1 => AcquireReply::Acquired(value.max(0) as u64),
        0 => AcquireReply::Held(value),
        _ => AcquireReply::NotOwner,
    })
}

/// Returns the owner's remaining hold count, or `None` when it held nothing.
pub(crate) async fn release(
    conn: &mut MultiplexedConnection,
    keys: &LockKeys,
    owner: &str,
    scope: ReleaseScope,
) -> redis::RedisResult<Option<u64>> {
    let left: i64 = RELEASE
        .key(keys.hash())
        .key(keys.channel())
        .arg(owner)
        .arg(match scope {
            ReleaseScope::One => "one",
            ReleaseScope::All => "all",
        })
        .invoke_async(conn)
        .await?;
    Ok(u64::try_from(left).ok())
}

/// Renews `(hash, owner)` pairs in one call; answers per pair whether it is still held.
pub(crate) async fn renew(
    conn: &mut MultiplexedConnection,
    locks: &[(&str, &str)],
    lease_ms: u64,
) -> redis::RedisResult<Vec<bool>> {
    let mut invocation = RENEW.prepare_invoke();
    invocation.arg(lease_ms);
    for (hash, owner) in locks {
        invocation.key(*hash).arg(*owner);
    }
    let renewed: Vec<i64> = invocation.invoke_async(conn).await?;
    Ok(renewed.into_iter().map(|r| r == 1).collect())
}

pub(crate) async fn force_unlock(
    conn: &mut MultiplexedConnection,
    keys: &LockKeys,
) -> redis::RedisResult<bool> {
    let removed: i64 = FORCE_UNLOCK
        .key(keys.hash())
        .key(keys.channel())
        .invoke_async(conn)
        .await?;
    Ok(removed == 1)
}
