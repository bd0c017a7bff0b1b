//! The scripts that keep locks and places alive, and the operators' waiver of the restart
//! quarantine.

use crate::keys::LockKeys;
use crate::wire::conn::Conn;
use crate::wire::script::{Arg, Each, ScriptSpec, reply_statuses};
use crate::wire::scripts::acquire::{KnownEpoch, epoch_checked};
use crate::wire::scripts::reply::{ScriptReply, run};

reply_statuses! {
    /// What a renewal answers besides [`epoch_checked::EPOCH_CHANGED`].
    renewed {
        /// `{RENEWED, then per lock HELD or GONE}`.
        RENEWED = 0,
        /// This lock is still held, and was renewed.
        HELD = 1,
        /// This owner no longer holds this lock.
        GONE = -1,
    }
}

reply_statuses! {
    /// What a heartbeat answers per place.
    heartbeat_kept {
        /// Still queued: its liveness runs from the server's clock now.
        QUEUED = 1,
        /// No longer queued: granted meanwhile, or dropped as dead.
        NOT_QUEUED = 0,
    }
}

reply_statuses! {
    /// What a waiver of the restart quarantine answers.
    waived {
        /// A quarantine was waived, or a server without an epoch got one without it.
        WAIVED = 1,
        /// No quarantine ran.
        NONE_RAN = 0,
    }
}

static RENEW: ScriptSpec<1, 5> = ScriptSpec::new(
    "renew.lua",
    include_str!("../lua/renew.lua"),
    ["EPOCH"],
    [
        "LEASE_MS",
        "KNOWN_EPOCH",
        "QUARANTINE_MS",
        "KNOWN_LONGEST_LEASE_MS",
        "RESTART_KEEPS_WRITES",
    ],
    &[renewed::ALL, epoch_checked::ALL],
)
.with_each(Each {
    keys: &["hash", "readers"],
    args: &["owner"],
});

static HEARTBEAT: ScriptSpec<0, 1> = ScriptSpec::new(
    "heartbeat.lua",
    include_str!("../lua/heartbeat.lua"),
    [],
    ["ALIVE_MS"],
    &[heartbeat_kept::ALL],
)
.with_each(Each {
    keys: &["queue", "waiters"],
    args: &["owner"],
});

static EPOCH_WAIVE: ScriptSpec<1, 0> = ScriptSpec::new(
    "epoch_waive.lua",
    include_str!("../lua/epoch_waive.lua"),
    ["EPOCH"],
    [],
    &[waived::ALL],
);

#[cfg(test)]
pub(super) fn all() -> Vec<&'static dyn crate::wire::script::Described> {
    vec![&RENEW, &HEARTBEAT, &EPOCH_WAIVE]
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

/// Renews `(keys, owner)` pairs in one call, after checking the epoch; answers per pair
/// whether it is still held. With no pairs, only checks the epoch.
pub(crate) async fn renew(
    conn: &mut Conn,
    locks: &[(&LockKeys, &str)],
    lease_ms: u64,
    epoch: &KnownEpoch<'_>,
) -> redis::RedisResult<RenewReply> {
    let items: Vec<_> = locks
        .iter()
        .map(|(keys, owner)| ([keys.hash(), keys.readers()], [Arg::Text(owner)]))
        .collect();
    let args = [
        Arg::Number(lease_ms),
        Arg::Number(epoch.known),
        Arg::Number(epoch.quarantine_ms),
        Arg::Number(epoch.known_lease_ms),
        epoch.restart_keeps_writes(),
    ];
    let cmd = RENEW.command_each([epoch.key], args, &items);
    let reply = run(&RENEW, conn, &cmd).await?;
    Ok(match reply.status() {
        renewed::RENEWED => RenewReply::Renewed(
            reply
                .after_status()
                .iter()
                .map(|held| match *held {
                    renewed::HELD => Ok(true),
                    renewed::GONE => Ok(false),
                    _ => Err(reply.unknown()),
                })
                .collect::<redis::RedisResult<_>>()?,
        ),
        epoch_checked::EPOCH_CHANGED => RenewReply::EpochChanged {
            epoch: reply.non_negative(0),
            longest_lease_ms: reply.non_negative(1),
        },
        _ => return Err(reply.unknown()),
    })
}

/// Extends the liveness of `(keys, owner)` places in their queues in one call; answers per
/// place whether it is still queued.
pub(crate) async fn heartbeat(
    conn: &mut Conn,
    places: &[(&LockKeys, &str)],
    alive_ms: u64,
) -> redis::RedisResult<Vec<bool>> {
    let items: Vec<_> = places
        .iter()
        .map(|(keys, owner)| ([keys.queue(), keys.waiter_terms()], [Arg::Text(owner)]))
        .collect();
    let cmd = HEARTBEAT.command_each([], [Arg::Number(alive_ms)], &items);
    let kept: Vec<i64> = HEARTBEAT.lua().run(conn, &cmd).await?;
    kept.into_iter()
        .map(|kept| match kept {
            heartbeat_kept::QUEUED => Ok(true),
            heartbeat_kept::NOT_QUEUED => Ok(false),
            _ => Err(ScriptReply::new(HEARTBEAT.file, vec![kept]).unknown()),
        })
        .collect()
}

/// Waives the restart quarantine of the epoch at `epoch_key` (or gives a server without an
/// epoch its first one, without a quarantine); returns whether one was waived.
pub(crate) async fn waive_quarantine(conn: &mut Conn, epoch_key: &str) -> redis::RedisResult<bool> {
    let cmd = EPOCH_WAIVE.command([epoch_key], []);
    let reply = run(&EPOCH_WAIVE, conn, &cmd).await?;
    match reply.status() {
        waived::WAIVED => Ok(true),
        waived::NONE_RAN => Ok(false),
        _ => Err(reply.unknown()),
    }
}
