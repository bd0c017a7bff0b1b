//! One server runs the library's scripts as Redis Functions (`FCALL`), loaded on first use:
//! what must hold when the server loses them, and when it is over `maxmemory`, where a
//! function runs only if flagged to.

mod support;

use std::time::Duration;

use support::{RedisServer, command_calls, queue_behind};
use tower_redis_lock::LockClient;

/// What a grant may take to reach a waiter on a loaded machine.
const PROMPT: Duration = Duration::from_secs(10);

/// The libraries loaded on `server`, by name.
fn libraries(server: &RedisServer) -> Vec<String> {
    let listed: Vec<Vec<redis::Value>> = server.cmd(&["FUNCTION", "LIST"]);
    listed
        .iter()
        .filter_map(|library| match library.as_slice() {
            [
                redis::Value::BulkString(key),
                redis::Value::BulkString(name),
                ..,
            ] if key.as_slice() == b"library_name" => {
                Some(String::from_utf8_lossy(name).into_owned())
            }
            _ => None,
        })
        .collect()
}

/// Whether `name` is the library of this release's `script`.
fn is_ours(name: &str, script: &str) -> bool {
    let release = env!("CARGO_PKG_VERSION").replace('.', "_");
    name.starts_with(&format!("tower_redis_lock_{release}_{script}_"))
}

/// Loads a library `name` of one function that answers 1.
fn load_library(server: &RedisServer, name: &str) {
    let code =
        format!("#!lua name={name}\nredis.register_function('{name}', function() return 1 end)");
    let _: String = server.cmd(&["FUNCTION", "LOAD", &code]);
}

#[tokio::test]
async fn loading_its_functions_deletes_those_of_older_releases_and_no_other() {
    let server = RedisServer::start();
    let older = "tower_redis_lock_0_0_9_acquire_0123456789abcdef";
    let newer = "tower_redis_lock_99_0_0_acquire_0123456789abcdef";
    for name in [older, newer, "an_applications_own"] {
        load_library(&server, name);
    }
    let locks = support::client(&server).await;
    let lock = locks.lock("tenant-1").unwrap();
    lock.acquire().await.unwrap().release().await.unwrap();
    // Deleted in the background, after the load.
    let deleted = support::eventually(PROMPT, || {
        !libraries(&server).iter().any(|name| name == older)
    });
    assert!(deleted.await, "{:?}", libraries(&server));
    let loaded = libraries(&server);
    assert!(loaded.iter().any(|name| name == newer), "{loaded:?}");
    assert!(
        loaded.iter().any(|name| name == "an_applications_own"),
        "{loaded:?}"
    );
    assert!(
        loaded.iter().any(|name| is_ours(name, "acquire")),
        "{loaded:?}"
    );
}

#[tokio::test]
async fn scripts_run_as_functions_and_a_server_that_lost_them_loads_them_again() {
    let server = RedisServer::start();
    let locks = support::client(&server).await;
    let lock = locks.lock("tenant-1").unwrap();
    lock.acquire().await.unwrap().release().await.unwrap();
    assert!(command_calls(&server, "fcall") >= 1);
    assert_eq!(command_calls(&server, "evalsha"), 0);
    let loaded = libraries(&server);
    assert!(
        loaded.iter().any(|name| is_ours(name, "acquire")),
        "{loaded:?}"
    );

    // As a restart without the data, or an operator, leaves it.
    let _: () = server.cmd(&["FUNCTION", "FLUSH"]);
    let guard = lock.acquire().await.unwrap();
    assert!(guard.fencing_token() > 0);
    guard.release().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
    let loaded = libraries(&server);
    assert!(
        loaded.iter().any(|name| is_ours(name, "acquire")),
        "loaded again: {loaded:?}"
    );
    assert_eq!(command_calls(&server, "evalsha"), 0);
}

#[tokio::test]
async fn over_maxmemory_a_release_still_grants_its_waiter_and_a_free_lock_is_not_taken() {
    let server = RedisServer::start();
    let holder = support::client(&server).await;
    let waiter = support::client(&server).await;
    // A hand-over first: the functions of a look, a grant and a release are loaded while
    // Redis has room (a library is a write too).
    let (held, waiting) = queue_behind(&holder, &waiter, "warm-up").await;
    held.release().await.unwrap();
    waiting.await.unwrap().unwrap().release().await.unwrap();

    let (held, waiting) = queue_behind(&holder, &waiter, "tenant-1").await;
    // Every write that needs memory is refused from now on (noeviction, Redis's default).
    let _: () = server.cmd(&["CONFIG", "SET", "maxmemory", "1"]);
    held.release().await.unwrap();
    let granted = tokio::time::timeout(PROMPT, waiting)
        .await
        .expect("the release granted the waiter over maxmemory")
        .unwrap()
        .unwrap();
    assert!(granted.is_held());
    // A new holder of a free lock would need memory: refused before anything is written.
    let free = holder.lock("tenant-2").unwrap();
    let refused = free.try_acquire().await;
    assert!(refused.is_err(), "{refused:?}");
    let _: () = server.cmd(&["CONFIG", "SET", "maxmemory", "0"]);
    assert!(!free.is_locked().await.unwrap());
    granted.release().await.unwrap();
}

/// Every kind of call a client of one server makes, as functions: no script runs as a script
/// (a library that failed to load would, silently).
#[tokio::test]
async fn every_operation_on_one_server_runs_as_a_function() {
    let server = RedisServer::start();
    let lease = Duration::from_millis(900);
    let locks = support::client_with_lease(&server.url(), lease).await;
    let other = support::client_with_lease(&server.url(), lease).await;

    // Taken free, entered again, one hold released, a refused try, a hand-over through Redis
    // (the waiter's look, heartbeat and grant), renewals past a third of the lease.
    let lock = locks.lock("tour").unwrap();
    let held = lock.acquire().await.unwrap();
    held.reenter().await.unwrap().release().await.unwrap();
    assert!(
        other
            .lock("tour")
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .is_none()
    );
    let next = other.lock("tour").unwrap();
    let waiting = tokio::spawn(async move { next.acquire().await });
    assert!(support::eventually(PROMPT, || other.queued_waiters() == 1).await);
    // Time passing is what is under test: the watchdog renews the lease within it.
    tokio::time::sleep(lease).await;
    assert!(held.is_held(), "renewed");
    let written = held
        .write_if_held(&tower_redis_lock::GuardedWrites::new().set("tour:written", "yes"))
        .await
        .unwrap();
    assert!(written);
    held.release().await.unwrap();
    let granted = tokio::time::timeout(PROMPT, waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(locks.inspect("tour").await.is_ok());
    granted.release().await.unwrap();

    // A read-write lock, a semaphore, force-unlocks.
    let rw = locks.read_write_lock("shared").unwrap();
    rw.read().acquire().await.unwrap().release().await.unwrap();
    rw.write().acquire().await.unwrap().release().await.unwrap();
    let permits = locks.semaphore("permits", 2).unwrap();
    let _permit = permits.acquire().await.unwrap();
    assert!(permits.force_unlock().await.unwrap());
    let _kept = locks.lock("forced").unwrap().acquire().await.unwrap();
    assert!(other.lock("forced").unwrap().force_unlock().await.unwrap());

    // Calls gathered (group commit): the scripts run once per item.
    let gathering = LockClient::builder(&server.url())
        .group_commit(true)
        .connections(1)
        .build()
        .await
        .unwrap();
    let guards = futures_util::future::join_all((0..8).map(|n| {
        let lock = gathering.lock(&format!("gathered-{n}")).unwrap();
        async move { lock.acquire().await.unwrap() }
    }))
    .await;
    futures_util::future::join_all(guards.into_iter().map(|guard| guard.release())).await;

    assert_eq!(command_calls(&server, "evalsha"), 0);
    assert_eq!(command_calls(&server, "eval"), 0);
    assert!(command_calls(&server, "fcall") > 20);
}
