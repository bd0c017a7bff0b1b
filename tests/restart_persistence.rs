//! A server that crashes (SIGKILL) and restarts from its own files, in each persistence mode
//! users run: none, RDB snapshots, an append-only file with `appendfsync everysec`, and one
//! with `appendfsync always`. Every restart that may have lost writes is a loss: the holder
//! of a lock granted after the last snapshot is told `DataLost`, and nobody is granted that
//! lock again before the server has been up the lease limit. A client told that its servers
//! fsync every write (`restart_keeps_writes`) keeps its holders through the restart.

mod support;

use std::time::{Duration, Instant};

use support::cluster::RedisCluster;
use support::{RedisServer, eventually};
use tower_redis_lock::{ErrorKind, LockClient, LockClientBuilder, LockGuard, LostReason};

/// Bound for steps that normally take milliseconds; generous because CI machines are shared
/// and a debug build on two cores can stall for a while.
const SLACK: Duration = Duration::from_secs(3);

/// The lease limit, and so the quarantine: long enough to tell a grant at once from one after
/// the quarantine on a busy machine, short enough for a quick test.
const LIMIT: Duration = Duration::from_secs(6);

/// The watchdog lease: a holder renews every third of it and stays vouched for nine tenths of
/// it after its last renewal (3.6 s), so a restart that takes a busy machine two seconds still
/// reaches the holder, which hears why (`DataLost`), not only that it could not renew
/// (`Unreachable`). With 2 s, a restart from `appendfsync always` on a loaded CI machine
/// outlasted it.
const WATCHDOG_LEASE: Duration = Duration::from_secs(4);

/// Snapshots only when asked (`SAVE`), as a server between two of its save points is.
const SNAPSHOTS: &[&str] = &["--save", "3600 1"];
const AOF_EVERYSEC: &[&str] = &["--appendonly", "yes", "--appendfsync", "everysec"];
const AOF_ALWAYS: &[&str] = &["--appendonly", "yes", "--appendfsync", "always"];

/// A client with the lease limit [`LIMIT`] and the watchdog lease [`WATCHDOG_LEASE`] within
/// it, renewing every 1.33 s, so a holder hears of a loss well inside the quarantine.
fn client(url: &str) -> LockClientBuilder {
    LockClient::builder(url)
        .lease_limit(LIMIT)
        .watchdog_lease(WATCHDOG_LEASE)
        .command_timeout(Duration::from_millis(500))
}

/// Makes what the server holds now durable in the files its settings `files` load at a
/// restart, so that the epoch comes back with them: a snapshot, or a rewritten append-only
/// file (waited for until the server says it is done).
async fn persist_now(server: &RedisServer, files: &[&str]) {
    if files == SNAPSHOTS {
        let _: () = server.cmd(&["SAVE"]);
    } else if files.contains(&"--appendonly") {
        let _: String = server.cmd(&["BGREWRITEAOF"]);
        let done = eventually(SLACK, || {
            let info: String = server.cmd(&["INFO", "persistence"]);
            info.contains("aof_rewrite_in_progress:0") && info.contains("aof_rewrite_scheduled:0")
        })
        .await;
        assert!(done, "the append-only file was rewritten");
    }
}

/// Takes `name` through `locks` and records when its lost signal fires, and why.
async fn hold(
    locks: &LockClient,
    name: &str,
) -> (LockGuard, tokio::task::JoinHandle<(Instant, LostReason)>) {
    let guard = locks.lock(name).unwrap().acquire().await.unwrap();
    let lost = guard.lost_signal();
    let told = tokio::spawn(async move {
        let reason = lost.lost().await;
        (Instant::now(), reason)
    });
    (guard, told)
}

/// What another client, `other`, meets when it asks for the lock `after` holds (its holder
/// told through `told`) once the server restarted at `restarted_at` from files that may miss
/// writes: the lock only once the server has been up the lease limit, after its holder was
/// told, and with a larger token. Returns why the holder was told.
async fn taken_only_after_the_quarantine(
    other: &LockClient,
    after: &LockGuard,
    told: tokio::task::JoinHandle<(Instant, LostReason)>,
    restarted_at: Instant,
) -> LostReason {
    let taken = other
        .lock(after.name())
        .unwrap()
        .acquire_timeout(LIMIT + SLACK * 2)
        .await
        .expect("the lock is granted once the quarantine is over");
    let taken_at = Instant::now();
    let (told_at, reason) = told.await.unwrap();
    assert!(
        told_at < taken_at,
        "the holder was told {:?} after the restart, the lock granted again after {:?}",
        told_at - restarted_at,
        taken_at - restarted_at
    );
    assert!(
        taken_at - restarted_at >= LIMIT - Duration::from_millis(100),
        "nobody gets a lock of the restarted server before it has been up the lease limit: \
         granted after {:?}",
        taken_at - restarted_at
    );
    assert!(taken.fencing_token() > after.fencing_token());
    reason
}

/// The server with persistence `files` holds a lock granted before its last snapshot or
/// rewrite and one granted after; it crashes and restarts from its files. The holder of the
/// later lock is told `DataLost`, and another client gets that lock only once the server has
/// been up the lease limit.
async fn a_restart_from_files_is_a_loss(files: &[&str]) {
    let mut server = RedisServer::start_with(files);
    let holder = client(&server.url()).build().await.unwrap();
    let (before, _) = hold(&holder, "before-snapshot").await;
    persist_now(&server, files).await;
    let (after, told) = hold(&holder, "after-snapshot").await;

    server.crash_and_restart(files);
    let restarted_at = Instant::now();
    let epoch: Option<String> = server.cmd(&["GET", "lock:epoch"]);
    assert_eq!(
        epoch.is_some(),
        !files.is_empty(),
        "the epoch comes back with the files, and only with them: {epoch:?}"
    );
    let other = client(&server.url()).build().await.unwrap();
    let reason = taken_only_after_the_quarantine(&other, &after, told, restarted_at).await;
    assert_eq!(reason, LostReason::DataLost, "{files:?}");
    assert!(!before.is_held(), "the earlier lock went with its epoch");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_persistence_is_a_loss() {
    a_restart_from_files_is_a_loss(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_from_a_snapshot_is_a_loss() {
    a_restart_from_files_is_a_loss(SNAPSHOTS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_from_an_append_only_file_synced_every_second_is_a_loss() {
    a_restart_from_files_is_a_loss(AOF_EVERYSEC).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_from_an_append_only_file_synced_every_write_is_a_loss_unless_the_client_is_told()
{
    a_restart_from_files_is_a_loss(AOF_ALWAYS).await;
}

/// A client told that every write is synced checks it when it is built: a server with
/// snapshots alone, or an append-only file synced every second, is refused with a clear
/// error; one with `appendfsync always` is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_told_that_every_write_is_synced_is_refused_by_a_server_that_does_not() {
    for files in [SNAPSHOTS, AOF_EVERYSEC] {
        let server = RedisServer::start_with(files);
        let err = client(&server.url())
            .restart_keeps_writes(true)
            .build()
            .await
            .expect_err("built on a server that does not sync every write");
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{files:?}: {err}");
        assert!(err.to_string().contains("appendfsync"), "{err}");
    }
    let server = RedisServer::start_with(AOF_ALWAYS);
    let locks = client(&server.url())
        .restart_keeps_writes(true)
        .build()
        .await
        .expect("every write synced");
    locks.shutdown().await;
}

/// Clients checked and told that every write is synced, of a server whose append-only file
/// is turned off after (`CONFIG SET appendonly no`) and which restarts from its snapshot:
/// the scripts see it (`aof_enabled:0`), and the restart is a loss all the same. Before, the
/// clients' word alone counted and the lock was granted again 5 ms after the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_from_a_snapshot_is_a_loss_even_to_clients_told_that_every_write_is_synced() {
    let mut server = RedisServer::start_with(AOF_ALWAYS);
    let told = |url: &str| client(url).restart_keeps_writes(true);
    let holder = told(&server.url()).build().await.unwrap();
    let other = told(&server.url()).build().await.unwrap();
    let () = server.cmd(&["CONFIG", "SET", "appendonly", "no"]);
    let (before, _) = hold(&holder, "before-snapshot").await;
    persist_now(&server, SNAPSHOTS).await;
    let (after, told_lost) = hold(&holder, "after-snapshot").await;

    server.crash_and_restart(SNAPSHOTS);
    let restarted_at = Instant::now();
    let reason = taken_only_after_the_quarantine(&other, &after, told_lost, restarted_at).await;
    assert_eq!(reason, LostReason::DataLost);
    assert!(!before.is_held(), "the earlier lock went with its epoch");
}

/// With `appendfsync always` and clients told so, the restart loses nothing: the holder keeps
/// its lock and is told nothing, another client waits for its release, and no quarantine
/// runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_told_that_every_write_is_synced_keeps_its_holders_through_a_restart() {
    let mut server = RedisServer::start_with(AOF_ALWAYS);
    let holder = client(&server.url())
        .restart_keeps_writes(true)
        .build()
        .await
        .unwrap();
    let (held, told) = hold(&holder, "kept").await;

    server.crash_and_restart(AOF_ALWAYS);
    let other = client(&server.url())
        .restart_keeps_writes(true)
        .build()
        .await
        .unwrap();
    let lock = other.lock("kept").unwrap();
    let err = lock.acquire_timeout(WATCHDOG_LEASE / 2).await.unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::Timeout,
        "the holder still holds it: {err}"
    );
    assert_eq!(other.restart_quarantine_left(), None);
    // A renewal ran since the restart (every 1.33 s, within the 2 s wait): the holder still
    // holds it.
    assert!(held.is_held() && !told.is_finished());

    let token = held.fencing_token();
    held.release().await.unwrap();
    let taken = lock.acquire_timeout(SLACK).await.unwrap();
    assert!(taken.fencing_token() > token);
    told.abort();
}

/// A cluster master restarted from its snapshot (a `SAVE`, then SIGKILL) keeps its slots and
/// their epochs: the slot of a lock granted after the snapshot is quarantined from the
/// master's start, and its holder is told before anyone else is granted it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_master_restarted_from_its_snapshot_quarantines_the_slot_of_a_lock_granted_after_it()
 {
    let mut cluster = RedisCluster::start(3);
    cluster.provision_epochs().await;
    let client = |urls: Vec<String>| {
        LockClient::builder_cluster(urls)
            .lease_limit(LIMIT)
            .watchdog_lease(WATCHDOG_LEASE)
            .command_timeout(Duration::from_millis(500))
            .build()
    };
    let holder = client(cluster.urls()).await.unwrap();
    let master = cluster.masters()[0];
    let mut on_master = (0..)
        .map(|n| format!("order-{n}"))
        .filter(|name| cluster.node_of(&format!("lock:{{{name}}}")) == master);
    let (earlier, later) = (on_master.next().unwrap(), on_master.next().unwrap());
    let (_before, _) = hold(&holder, &earlier).await;
    let _: () = cluster.cmd(master, &["SAVE"]);
    let (after, told) = hold(&holder, &later).await;

    cluster.kill(master);
    cluster.restart(master);
    let restarted_at = Instant::now();
    assert!(
        cluster.serving(master, SLACK * 3).await,
        "the restarted master serves its slots"
    );
    let other = client(cluster.urls()).await.unwrap();
    taken_only_after_the_quarantine(&other, &after, told, restarted_at).await;
}

/// On a cluster the check asks every master: one without `appendfsync always` is named in
/// the refusal; once every master syncs every write, the client is built.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_client_told_that_every_write_is_synced_checks_every_master() {
    let cluster = RedisCluster::start(3);
    let build = || {
        LockClient::builder_cluster(cluster.urls())
            .restart_keeps_writes(true)
            .build()
    };
    for port in cluster.ports() {
        let () = cluster.cmd(port, &["CONFIG", "SET", "appendfsync", "always"]);
        let () = cluster.cmd(port, &["CONFIG", "SET", "appendonly", "yes"]);
    }
    let lax = cluster.masters()[1].to_string();
    let () = cluster.cmd(
        cluster.masters()[1],
        &["CONFIG", "SET", "appendfsync", "everysec"],
    );
    let Err(err) = build().await else {
        panic!("built though a master syncs every second");
    };
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert!(err.to_string().contains(&lax), "the master is named: {err}");
    let () = cluster.cmd(
        cluster.masters()[1],
        &["CONFIG", "SET", "appendfsync", "always"],
    );
    let Ok(locks) = build().await else {
        panic!("refused though every master syncs every write");
    };
    locks.shutdown().await;
}
