//! One server and a cluster run the library's scripts as Redis Functions (`FCALL`), loaded on
//! first use: what must hold when a server or a master loses them, and when it is over
//! `maxmemory`, where a function runs only if flagged to.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use support::cluster::RedisCluster;
use support::{RedisServer, Waiting, command_calls, queue_behind};
use tower_redis_lock::{LockClient, LockGuard};

/// What a grant may take to reach a waiter on a loaded machine.
const PROMPT: Duration = Duration::from_secs(10);

/// The libraries loaded on `server`, by name.
fn libraries(server: &RedisServer) -> Vec<String> {
    names(server.cmd(&["FUNCTION", "LIST"]))
}

/// The names of the libraries of a `FUNCTION LIST` reply.
fn names(listed: Vec<Vec<redis::Value>>) -> Vec<String> {
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

/// A library `name` of one function that answers 1.
fn library_code(name: &str) -> String {
    format!("#!lua name={name}\nredis.register_function('{name}', function() return 1 end)")
}

/// Loads a library `name` of one function that answers 1.
fn load_library(server: &RedisServer, name: &str) {
    let _: String = server.cmd(&["FUNCTION", "LOAD", &library_code(name)]);
}

/// An older release's library of the acquire.
const OLDER: &str = "tower_redis_lock_0_0_9_acquire_0123456789abcdef";

#[tokio::test]
async fn loading_its_functions_deletes_those_of_older_releases_and_no_other() {
    let server = RedisServer::start();
    let newer = "tower_redis_lock_99_0_0_acquire_0123456789abcdef";
    for name in [OLDER, newer, "an_applications_own"] {
        load_library(&server, name);
    }
    let locks = support::client(&server).await;
    let lock = locks.lock("tenant-1").unwrap();
    lock.acquire().await.unwrap().release().await.unwrap();
    // Deleted in the background, after the load.
    let deleted = support::eventually(PROMPT, || {
        !libraries(&server).iter().any(|name| name == OLDER)
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

/// Puts `server` over `maxmemory` (every write that needs memory refused from then on:
/// `noeviction`, Redis's default), releases `held`, and returns what its release granted the
/// lock's `waiting` waiter.
async fn released_over_maxmemory(
    server: &RedisServer,
    held: LockGuard,
    waiting: Waiting,
) -> LockGuard {
    let _: () = server.cmd(&["CONFIG", "SET", "maxmemory", "1"]);
    held.release().await.unwrap();
    let granted = tokio::time::timeout(PROMPT, waiting)
        .await
        .expect("the release granted the waiter over maxmemory")
        .unwrap()
        .unwrap();
    assert!(granted.is_held());
    granted
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
    let granted = released_over_maxmemory(&server, held, waiting).await;
    // A new holder of a free lock would need memory: refused before anything is written.
    let free = holder.lock("tenant-2").unwrap();
    let refused = free.try_acquire().await;
    assert!(refused.is_err(), "{refused:?}");
    let _: () = server.cmd(&["CONFIG", "SET", "maxmemory", "0"]);
    assert!(!free.is_locked().await.unwrap());
    granted.release().await.unwrap();
}

/// A server over `maxmemory` that lost the functions (a restart without its data) cannot load
/// them again, a library being a write: the release runs as a script by its SHA. Redis refuses
/// a script's write over `maxmemory` only while the script has written nothing, and a
/// release's first write deletes (`HDEL`): it runs whole, and still grants its waiter.
#[tokio::test]
async fn over_maxmemory_without_the_functions_a_release_still_grants_its_waiter() {
    let server = RedisServer::start();
    let holder = support::client(&server).await;
    let waiter = support::client(&server).await;
    let (held, waiting) = queue_behind(&holder, &waiter, "tenant-1").await;
    let _: () = server.cmd(&["FUNCTION", "FLUSH"]);
    let granted = released_over_maxmemory(&server, held, waiting).await;
    assert!(libraries(&server).is_empty(), "loaded over maxmemory");
    let _: () = server.cmd(&["CONFIG", "SET", "maxmemory", "0"]);
    granted.release().await.unwrap();
    assert!(!holder.lock("tenant-1").unwrap().is_locked().await.unwrap());
}

/// Every kind of call a client of one server makes, as functions: no script runs as a script
/// (a library that failed to load would, silently).
#[tokio::test]
async fn every_operation_on_one_server_runs_as_a_function() {
    let server = RedisServer::start();
    let lease = Duration::from_millis(900);
    let locks = support::client_with_lease(&server.url(), lease).await;
    let other = support::client_with_lease(&server.url(), lease).await;
    every_kind_of_call(&locks, &other, lease).await;

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

/// Every kind of call of `locks`, with `other` as another instance, whose leases are `lease`.
async fn every_kind_of_call(locks: &LockClient, other: &LockClient, lease: Duration) {
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
        .write_if_held(&tower_redis_lock::GuardedWrites::new().set("tour:{tour}:written", "yes"))
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
}

/// A cluster runs the scripts as functions too, every kind of call: each master loads them
/// when a lock of its slots first needs them (and deletes an older release's), a master that
/// lost them (a restart without its data, an operator's `FUNCTION FLUSH`) loads them again,
/// and no script runs by its SHA.
#[tokio::test(flavor = "multi_thread")]
async fn a_cluster_runs_its_scripts_as_functions_and_a_master_that_lost_them_loads_them_again() {
    let cluster = RedisCluster::start(3);
    cluster.provision_epochs().await;
    let locks = LockClient::builder_cluster(cluster.urls())
        .build()
        .await
        .unwrap();
    let masters = cluster.masters();
    for &port in &masters {
        let _: String = cluster.cmd(port, &["FUNCTION", "LOAD", &library_code(OLDER)]);
    }
    // A lock name served by each master.
    let mut name_on: BTreeMap<u16, String> = BTreeMap::new();
    for n in 0.. {
        let name = format!("tenant-{n}");
        name_on
            .entry(cluster.node_of(&format!("lock:{{{name}}}")))
            .or_insert(name);
        if name_on.len() == masters.len() {
            break;
        }
    }
    let take_and_release = |name: String| {
        let lock = locks.lock(&name).unwrap();
        async move {
            let guard = lock.acquire().await.unwrap();
            assert!(guard.fencing_token() > 0);
            guard.release().await.unwrap();
            assert!(!lock.is_locked().await.unwrap());
        }
    };
    for name in name_on.values() {
        take_and_release(name.clone()).await;
    }
    let lease = Duration::from_millis(900);
    let with_lease = || {
        LockClient::builder_cluster(cluster.urls())
            .watchdog_lease(lease)
            .lease_limit(Duration::from_secs(5))
            .build()
    };
    let (one, other) = (with_lease().await.unwrap(), with_lease().await.unwrap());
    every_kind_of_call(&one, &other, lease).await;
    let acquire_loaded = |port: u16| {
        names(cluster.cmd(port, &["FUNCTION", "LIST"]))
            .iter()
            .any(|name| is_ours(name, "acquire"))
    };
    for &port in &masters {
        assert!(cluster.command_calls(port, "fcall") >= 1, "master {port}");
        assert!(acquire_loaded(port), "master {port}");
    }
    // Deleted in the background, after a load, from every master.
    let older_left = || {
        masters.iter().any(|&port| {
            names(cluster.cmd(port, &["FUNCTION", "LIST"]))
                .iter()
                .any(|name| name == OLDER)
        })
    };
    assert!(support::eventually(PROMPT, || !older_left()).await);

    let lost = masters[0];
    let _: () = cluster.cmd(lost, &["FUNCTION", "FLUSH"]);
    assert!(!acquire_loaded(lost));
    take_and_release(name_on[&lost].clone()).await;
    assert!(acquire_loaded(lost), "loaded again on master {lost}");
    for &port in &masters {
        assert_eq!(cluster.command_calls(port, "evalsha"), 0, "master {port}");
        assert_eq!(cluster.command_calls(port, "eval"), 0, "master {port}");
    }
}
