//! `hold`: takes a lock, a semaphore's permits or a quorum lock, reports it as a JSON line,
//! keeps it for the time asked, and reports a timed-out wait (exit code 3) or a lost lease
//! (exit code 4) apart from an error.

use std::future::Future;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::json;
use tower_redis_lock::{ErrorKind, Lease, Lock, LockError, LostSignal, RedLock, Semaphore};

use crate::out::emit;
use crate::show::millis;

/// `--lease` fixes the lease; without it the watchdog keeps renewing it.
pub(crate) fn lease_of(lease: Option<Duration>) -> Lease {
    lease.map_or(Lease::Watchdog, Lease::Fixed)
}

/// The guard, or `None` once a wait that timed out is reported (exit code 3).
fn unless_timed_out<G>(
    acquired: Result<G, LockError>,
    name: &str,
    started: Instant,
) -> Result<Option<G>, LockError> {
    match acquired {
        Ok(guard) => Ok(Some(guard)),
        Err(err) if err.kind() == ErrorKind::Timeout => {
            emit(json!({"event": "timeout", "name": name, "waited_ms": millis(started.elapsed())}));
            Ok(None)
        }
        Err(err) => Err(err),
    }
}

/// `hold` of a lock: waits for it (up to `wait`), reports it acquired, and keeps it as
/// `keep_until` says.
pub(crate) async fn hold(
    lock: Lock,
    hold_for: Duration,
    wait: Option<Duration>,
) -> Result<ExitCode, LockError> {
    let name = lock.name().to_owned();
    let started = Instant::now();
    let acquired = match wait {
        Some(wait) => lock.acquire_timeout(wait).await,
        None => lock.acquire().await,
    };
    let Some(guard) = unless_timed_out(acquired, &name, started)? else {
        return Ok(ExitCode::from(3));
    };
    let token = guard.fencing_token();
    emit(json!({
        "event": "acquired",
        "name": name,
        "kind": format!("{:?}", lock.kind()),
        "token": token,
        "waited_ms": millis(started.elapsed()),
        "pid": std::process::id(),
        "owner": guard.owner_id(),
    }));
    let lost = guard.lost_signal();
    keep_until(&name, json!(token), hold_for, lost, guard.release()).await
}

/// `hold --kind semaphore`: takes `take` of the semaphore's permits, and keeps them as `hold`
/// keeps a lock.
pub(crate) async fn hold_semaphore(
    semaphore: Semaphore,
    take: u32,
    hold_for: Duration,
    wait: Option<Duration>,
) -> Result<ExitCode, LockError> {
    let name = semaphore.name().to_owned();
    let started = Instant::now();
    let acquired = match wait {
        Some(wait) => semaphore.acquire_many_timeout(take, wait).await,
        None => semaphore.acquire_many(take).await,
    };
    let Some(guard) = unless_timed_out(acquired, &name, started)? else {
        return Ok(ExitCode::from(3));
    };
    let token = guard.fencing_token();
    emit(json!({
        "event": "acquired",
        "name": name,
        "kind": "Semaphore",
        "permits": semaphore.permits(),
        "take": guard.permits(),
        "token": token,
        "waited_ms": millis(started.elapsed()),
        "pid": std::process::id(),
        "owner": guard.owner_id(),
    }));
    let lost = guard.lost_signal();
    keep_until(&name, json!(token), hold_for, lost, guard.release()).await
}

/// `hold --kind redlock`: a quorum lock reports a token per server and how long its hold
/// stays valid, not one token.
pub(crate) async fn hold_redlock(
    lock: RedLock,
    hold_for: Duration,
    wait: Option<Duration>,
) -> Result<ExitCode, LockError> {
    let name = lock.name().to_owned();
    let started = Instant::now();
    let acquired = match wait {
        Some(wait) => lock.acquire_timeout(wait).await,
        None => lock.acquire().await,
    };
    let Some(guard) = unless_timed_out(acquired, &name, started)? else {
        return Ok(ExitCode::from(3));
    };
    let tokens = json!(guard.fencing_tokens());
    emit(json!({
        "event": "acquired",
        "name": name,
        "kind": "RedLock",
        "tokens": tokens,
        "held_on": guard.held_on(),
        "servers": lock.servers(),
        "validity_ms": millis(guard.validity().saturating_duration_since(Instant::now())),
        "waited_ms": millis(started.elapsed()),
        "pid": std::process::id(),
    }));
    let lost = guard.lost_signal();
    keep_until(&name, tokens, hold_for, lost, guard.release()).await
}

/// Holds for `hold_for` and then releases, unless the lease is lost first (exit code 4).
async fn keep_until(
    name: &str,
    token: serde_json::Value,
    hold_for: Duration,
    lost: LostSignal,
    release: impl Future<Output = Result<(), LockError>>,
) -> Result<ExitCode, LockError> {
    let held_since = Instant::now();
    tokio::select! {
        () = tokio::time::sleep(hold_for) => {
            release.await?;
            emit(json!({"event": "released", "name": name, "token": token, "held_ms": millis(held_since.elapsed()), "pid": std::process::id()}));
            Ok(ExitCode::SUCCESS)
        }
        reason = lost.lost() => {
            emit(json!({"event": "lost", "name": name, "token": token, "reason": format!("{reason:?}"), "held_ms": millis(held_since.elapsed()), "pid": std::process::id()}));
            Ok(ExitCode::from(4))
        }
    }
}
