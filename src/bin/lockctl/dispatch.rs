//! Which command runs what: the operator's commands (`operate`), `hold` of every kind but a
//! quorum lock's, `waive-quarantine` and `idempotent`, each on the one client `connect`
//! made.

use std::process::ExitCode;

use serde_json::json;
use tower_redis_lock::{LockClient, LockError};

use crate::args::{Command, Kind};
use crate::hold::{hold, hold_semaphore, lease_of};
use crate::out::emit;
use crate::{idempotent, operate};

/// Runs `command` (any but a quorum lock's hold) with `locks`.
pub(crate) async fn run_on(locks: &LockClient, command: Command) -> Result<ExitCode, LockError> {
    match command {
        Command::Hold {
            name,
            hold_for,
            lease,
            wait,
            kind,
        } => {
            let lock = match kind {
                Kind::Semaphore { permits, take } => {
                    let semaphore = locks.semaphore(&name, permits)?;
                    let semaphore = semaphore.with_lease(lease_of(lease));
                    return hold_semaphore(semaphore, take, hold_for, wait).await;
                }
                Kind::Fair => locks.fair_lock(&name)?,
                Kind::Read => locks.read_write_lock(&name)?.read(),
                Kind::Write => locks.read_write_lock(&name)?.write(),
                Kind::Exclusive | Kind::RedLock => locks.lock(&name)?,
            };
            hold(lock.with_lease(lease_of(lease)), hold_for, wait).await
        }
        Command::Inspect {
            name,
            semaphore,
            json,
        } => operate::inspect(locks, &name, semaphore, json).await,
        Command::List {
            pattern,
            cursor,
            limit,
            json,
        } => operate::list(locks, pattern.as_deref(), cursor.as_deref(), limit, json).await,
        Command::Watch(watch) => operate::watch(locks, watch).await,
        Command::ForceUnlock {
            name,
            semaphore,
            yes,
            json,
        } => operate::force_unlock(locks, &name, semaphore, yes, json).await,
        Command::WaiveQuarantine => {
            let waived = locks.waive_restart_quarantine().await?;
            emit(json!({"event": "quarantine-waived", "waived": waived}));
            Ok(ExitCode::SUCCESS)
        }
        Command::Idempotent {
            key,
            scope,
            layer_prefix,
            json,
        } => idempotent::show(locks, &key, &scope, &layer_prefix, json).await,
        // It needs no client: `connect::run` runs it on connections to each master.
        Command::Stranded(_) => unreachable!("connect::run runs stranded without a client"),
    }
}
