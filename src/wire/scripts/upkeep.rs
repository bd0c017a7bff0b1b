//! The scripts that keep locks and places alive, and the operators' waiver of the restart
//! quarantine.

use crate::keys::LockKeys;
use crate::wire::conn::Conn;
use crate::wire::script::{RUNS_OVER_MAXMEMORY, ScriptSpec};
use crate::wire::script_inputs::script_inputs;
use crate::wire::script_reply::{ScriptReply, reply_statuses};
use crate::wire::scripts::acquire::{KnownEpoch, epoch_checked};

reply_statuses! {
    /// What a renewal answers besides [`epoch_checked::EPOCH_CHANGED`].
    renewed {
        /// The epoch is the one the client knows.
        RENEWED = 0 => Renewed {
            /// Per lock, in order: [`HELD`] or [`GONE`].
            per_lock: Vec<i64>,
        },
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

script_inputs! {
    /// What a renewal takes once: the lease, and the epoch the client knows.
    struct RenewInputs<'a> {
        keys { epoch: &'a str }
        args {
            lease_ms: u64,
            known_epoch: u64,
            quarantine_ms: u64,
            known_longest_lease_ms: u64,
            restart_keeps_writes: bool,
        }
    }
}

script_inputs! {
    /// What a renewal takes per lock.
    struct RenewItem<'a> {
        keys {
            lock: &'a str,
            readers: &'a str,
        }
        args { owner: &'a str }
    }
}

script_inputs! {
    /// What a heartbeat takes once.
    struct HeartbeatInputs {
        keys {}
        args { alive_ms: u64 }
    }
}

script_inputs! {
    /// What a heartbeat takes per place.
    struct HeartbeatItem<'a> {
        keys {
            queue: &'a str,
            waiter_terms: &'a str,
        }
        args { owner: &'a str }
    }
}

script_inputs! {
    /// What a waiver takes.
    struct WaiveInputs<'a> {
        keys { epoch: &'a str }
        args {}
    }
}

static RENEW: ScriptSpec<RenewInputs<'static>, RenewItem<'static>> = ScriptSpec::new(
    "renew.lua",
    include_str!("../lua/renew.lua"),
    &[renewed::ALL, epoch_checked::ALL],
)
.with_function_flags(RUNS_OVER_MAXMEMORY);

static HEARTBEAT: ScriptSpec<HeartbeatInputs, HeartbeatItem<'static>> = ScriptSpec::new(
    "heartbeat.lua",
    include_str!("../lua/heartbeat.lua"),
    &[heartbeat_kept::ALL],
)
.with_function_flags(RUNS_OVER_MAXMEMORY);

static EPOCH_WAIVE: ScriptSpec<WaiveInputs<'static>> = ScriptSpec::new(
    "epoch_waive.lua",
    include_str!("../lua/epoch_waive.lua"),
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
    let items: Vec<RenewItem<'_>> = locks
        .iter()
        .map(|(keys, owner)| RenewItem {
            lock: keys.hash(),
            readers: keys.readers(),
            owner,
        })
        .collect();
    let inputs = RenewInputs {
        epoch: epoch.key,
        lease_ms,
        known_epoch: epoch.known,
        quarantine_ms: epoch.quarantine_ms,
        known_longest_lease_ms: epoch.known_lease_ms,
        restart_keeps_writes: epoch.keeps_writes,
    };
    let cmd = RENEW.command_each(&inputs, &items);
    let reply = RENEW.run(conn, &cmd).await?;
    Ok(match reply.status() {
        renewed::RENEWED => {
            let renewed::Renewed { per_lock } = reply.values()?;
            RenewReply::Renewed(
                per_lock
                    .into_iter()
                    .map(|held| match held {
                        renewed::HELD => Ok(true),
                        renewed::GONE => Ok(false),
                        _ => Err(reply.unknown()),
                    })
                    .collect::<redis::RedisResult<_>>()?,
            )
        }
        epoch_checked::EPOCH_CHANGED => {
            let epoch_checked::EpochChanged {
                epoch,
                longest_lease_ms,
            } = reply.values()?;
            RenewReply::EpochChanged {
                epoch,
                longest_lease_ms,
            }
        }
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
    let items: Vec<HeartbeatItem<'_>> = places
        .iter()
        .map(|(keys, owner)| HeartbeatItem {
            queue: keys.queue(),
            waiter_terms: keys.waiter_terms(),
            owner,
        })
        .collect();
    let cmd = HEARTBEAT.command_each(&HeartbeatInputs { alive_ms }, &items);
    let kept: Vec<i64> = HEARTBEAT.lua().run(conn, &cmd).await?;
    kept.into_iter()
        .map(|kept| match kept {
            heartbeat_kept::QUEUED => Ok(true),
            heartbeat_kept::NOT_QUEUED => Ok(false),
            _ => Err(ScriptReply::new(HEARTBEAT.file, vec![redis::Value::Int(kept)]).unknown()),
        })
        .collect()
}

/// Waives the restart quarantine of the epoch at `epoch_key` (or gives a server without an
/// epoch its first one, without a quarantine); returns whether one was waived.
pub(crate) async fn waive_quarantine(conn: &mut Conn, epoch_key: &str) -> redis::RedisResult<bool> {
    let cmd = EPOCH_WAIVE.command(&WaiveInputs { epoch: epoch_key });
    let reply = EPOCH_WAIVE.run(conn, &cmd).await?;
    match reply.status() {
        waived::WAIVED => Ok(true),
        waived::NONE_RAN => Ok(false),
        _ => Err(reply.unknown()),
    }
}
