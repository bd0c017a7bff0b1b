//! Writes only a holder can make (`LockGuard::write_if_held`), against real servers: they
//! apply while the guard holds its lock, and a holder that lost it (force-unlocked, its lease
//! run out while it was paused, its Redis emptied) writes nothing, while the next holder
//! does. On a cluster they stay in the lock's slot, and follow it when it migrates.

mod support;

use std::time::Duration;

use support::clock::FakeClock;
use support::cluster::RedisCluster;
use support::proxy::FaultProxy;
use support::{RedisServer, client, client_with_lease};
use tower_redis_lock::{ErrorKind, GuardedWrites, Lease, Lock, LockClient, MAX_WRITE_ARGS};

/// Bound for what normally takes milliseconds; generous because CI machines are shared and a
/// debug build on two cores can stall for a while.
const SLACK: Duration = Duration::from_secs(10);

/// Waits (polling Redis) until nobody holds `lock`; returns whether that happened within
/// `bound`.
async fn until_free(lock: &Lock, bound: Duration) -> bool {
    tokio::time::timeout(bound, async {
        while lock.is_locked().await.expect("redis answers") {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .is_ok()
}

fn exists(server: &RedisServer, key: &str) -> bool {
    server.cmd::<i64>(&["EXISTS", key]) == 1
}

#[tokio::test]
async fn writes_apply_while_the_lock_is_held_with_the_expiries_asked_for() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let lock = locks.lock("ledger:7").unwrap();
    let guard = lock.acquire().await.unwrap();
    let tag = guard.hash_tag().to_owned();
    assert_eq!(tag, "{ledger:7}");
    assert_eq!(
        lock.hash_tag(),
        tag,
        "the same tag before the lock is taken"
    );
    let (balance, receipt, account, history) = (
        format!("balance:{tag}"),
        format!("receipt:{tag}"),
        format!("account:{tag}"),
        format!("history:{tag}"),
    );

    let writes = GuardedWrites::new()
        .set(&balance, "120")
        .set_with_ttl(&receipt, b"ok\0binary".to_vec(), Duration::from_secs(60))
        .hset(&account, [("owner", "ada"), ("limit", "500")])
        .pexpire(&account, Duration::from_secs(30))
        .command("RPUSH", &history, ["+20", "-5"])
        .del("gone");
    assert_eq!(writes.len(), 6);
    assert!(guard.write_if_held(&writes).await.unwrap());

    assert_eq!(server.cmd::<String>(&["GET", &balance]), "120");
    let receipt_value: Vec<u8> = server.cmd(&["GET", &receipt]);
    assert_eq!(
        receipt_value, b"ok\0binary",
        "values are bytes, zeros included"
    );
    let receipt_ttl: i64 = server.cmd(&["PTTL", &receipt]);
    assert!((50_000..=60_000).contains(&receipt_ttl), "{receipt_ttl}");
    let owner: String = server.cmd(&["HGET", &account, "owner"]);
    assert_eq!(owner, "ada");
    let account_ttl: i64 = server.cmd(&["PTTL", &account]);
    assert!((20_000..=30_000).contains(&account_ttl), "{account_ttl}");
    let history_items: Vec<String> = server.cmd(&["LRANGE", &history, "0", "-1"]);
    assert_eq!(history_items, ["+20", "-5"]);
    // On one server a key without the tag may be written too.
    assert!(
        guard
            .write_if_held(&GuardedWrites::new().set("untagged", "1"))
            .await
            .unwrap()
    );
    assert!(exists(&server, "untagged"));
    // No writes: only the check, "am I still the holder?".
    assert!(guard.write_if_held(&GuardedWrites::new()).await.unwrap());
    assert!(guard.is_held(), "writing does not touch the lock");
    guard.release().await.unwrap();
}

#[tokio::test]
async fn the_longest_command_allowed_applies_and_a_longer_one_is_refused_before_it_is_sent() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let guard = locks.lock("wide").unwrap().acquire().await.unwrap();
    let key = format!("fields:{}", guard.hash_tag());
    let fields = (0..MAX_WRITE_ARGS / 2).map(|n| (format!("f{n}"), n.to_string()));
    let widest = GuardedWrites::new().hset(&key, fields);
    assert!(guard.write_if_held(&widest).await.unwrap());
    let count: i64 = server.cmd(&["HLEN", &key]);
    assert_eq!(count as usize, MAX_WRITE_ARGS / 2);

    let other = format!("list:{}", guard.hash_tag());
    let wider = GuardedWrites::new().set(&other, "first").command(
        "RPUSH",
        &other,
        vec!["x"; MAX_WRITE_ARGS + 1],
    );
    let err = guard.write_if_held(&wider).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert!(!exists(&server, &other), "nothing of it was written");
}

#[tokio::test]
async fn a_force_unlocked_holder_writes_nothing_before_it_is_told() {
    let server = RedisServer::start();
    let (holder, operator) = (client(&server).await, client(&server).await);
    let guard = holder.lock("order-9").unwrap().acquire().await.unwrap();
    let key = format!("status:{}", guard.hash_tag());
    assert!(guard.write_if_held(&GuardedWrites::new()).await.unwrap());

    assert!(
        operator
            .lock("order-9")
            .unwrap()
            .force_unlock()
            .await
            .unwrap()
    );
    // The watchdog renews every 10 s: the holder has not heard of it yet, so the refusal
    // below comes from Redis.
    assert!(!guard.lost_signal().is_lost());
    let writes = GuardedWrites::new().set(&key, "shipped");
    assert!(!guard.write_if_held(&writes).await.unwrap());
    assert!(!exists(&server, &key), "a refused write wrote nothing");
    assert!(!guard.write_if_held(&GuardedWrites::new()).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_told_its_lease_is_lost_is_refused_without_asking_redis() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port()).await;
    let holder = client_with_lease(&proxy.url(), Duration::from_secs(1)).await;
    let operator = client(&server).await;
    let guard = holder.lock("order-10").unwrap().acquire().await.unwrap();
    assert!(
        operator
            .lock("order-10")
            .unwrap()
            .force_unlock()
            .await
            .unwrap()
    );
    tokio::time::timeout(SLACK, guard.lost_signal().lost())
        .await
        .expect("a renewal finds the lock gone");

    // Redis cannot be reached now: an answer at once says nothing was asked of it.
    proxy.black_hole();
    let key = format!("status:{}", guard.hash_tag());
    let writes = GuardedWrites::new().set(&key, "shipped");
    let refused = tokio::time::timeout(Duration::from_millis(400), guard.write_if_held(&writes))
        .await
        .expect("answered without a round trip");
    assert!(!refused.unwrap());
    assert!(!exists(&server, &key));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holder_whose_fixed_lease_ran_out_writes_nothing_and_the_next_holder_writes() {
    let server = RedisServer::start();
    let (paused, next) = (client(&server).await, client(&server).await);
    let lock = paused
        .lock("invoice-3")
        .unwrap()
        .with_lease(Lease::Fixed(Duration::from_millis(300)));
    let stale = lock.acquire().await.unwrap();
    let key = format!("total:{}", stale.hash_tag());

    // The holder does nothing (a paused process) until its lease ran out in Redis.
    assert!(
        until_free(&lock, SLACK).await,
        "the fixed lease never ran out"
    );
    let current = next
        .lock("invoice-3")
        .unwrap()
        .acquire_timeout(SLACK)
        .await
        .unwrap();

    assert!(
        !stale
            .write_if_held(&GuardedWrites::new().set(&key, "stale"))
            .await
            .unwrap(),
        "the holder whose lease ran out wrote"
    );
    assert!(!exists(&server, &key));
    assert!(
        current
            .write_if_held(&GuardedWrites::new().set(&key, "current"))
            .await
            .unwrap()
    );
    assert_eq!(server.cmd::<String>(&["GET", &key]), "current");
    assert!(
        !stale
            .write_if_held(&GuardedWrites::new().set(&key, "stale"))
            .await
            .unwrap()
    );
    assert_eq!(server.cmd::<String>(&["GET", &key]), "current");
}

#[tokio::test]
async fn a_holder_whose_lease_ran_out_by_the_servers_clock_writes_nothing_though_it_was_not_told() {
    let clock = FakeClock::new();
    let server = RedisServer::start_with_clock(&clock, 0, &[]);
    server.provision_epoch("lock:");
    let locks = client(&server).await;
    let guard = locks.lock("invoice-4").unwrap().acquire().await.unwrap();
    let key = format!("total:{}", guard.hash_tag());

    // Five minutes pass for Redis (a process paused that long, as far as the lease can
    // tell): far past the 30 s watchdog lease, and no renewal ran meanwhile.
    clock.step_forward(Duration::from_secs(300));
    assert!(
        support::eventually(SLACK, || !exists(&server, "lock:{invoice-4}")).await,
        "the step never showed in Redis"
    );
    assert!(
        !guard.lost_signal().is_lost(),
        "told already: a renewal ran"
    );
    let writes = GuardedWrites::new().set(&key, "stale");
    assert!(!guard.write_if_held(&writes).await.unwrap());
    assert!(!exists(&server, &key));
}

#[tokio::test]
async fn a_holder_whose_redis_was_flushed_writes_nothing() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let guard = locks.lock("cart-5").unwrap().acquire().await.unwrap();
    let key = format!("items:{}", guard.hash_tag());
    assert!(
        guard
            .write_if_held(&GuardedWrites::new().set(&key, "3"))
            .await
            .unwrap()
    );

    let _: () = server.cmd(&["FLUSHALL"]);
    assert!(
        !guard.lost_signal().is_lost(),
        "told already: a renewal ran"
    );
    assert!(
        !guard
            .write_if_held(&GuardedWrites::new().set(&key, "4"))
            .await
            .unwrap()
    );
    assert!(
        !exists(&server, &key),
        "the lost data was not written again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_redis_restarted_without_its_data_writes_nothing() {
    let mut server = RedisServer::start();
    let port = server.port();
    let locks = client(&server).await;
    let guard = locks.lock("cart-6").unwrap().acquire().await.unwrap();
    let key = format!("items:{}", guard.hash_tag());

    server.kill();
    let restarted = RedisServer::start_on(port);
    // The connection broke with the old server: the first tries may fail on it.
    let writes = GuardedWrites::new().set(&key, "4");
    let applied = tokio::time::timeout(SLACK, async {
        loop {
            match guard.write_if_held(&writes).await {
                Err(err) if err.kind() == ErrorKind::RedisUnavailable => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                outcome => return outcome,
            }
        }
    })
    .await
    .expect("the restarted server answers");
    assert!(!applied.unwrap(), "written after the lock was lost");
    assert!(!exists(&restarted, &key));
}

#[tokio::test]
async fn read_guards_cannot_write_and_the_write_side_can() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let rw = locks.read_write_lock("doc-1").unwrap();
    let key = format!("body:{}", rw.read().hash_tag());
    let writes = GuardedWrites::new().set(&key, "text");

    let read = rw.read().acquire().await.unwrap();
    let err = read.write_if_held(&writes).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UnsupportedGuard, "{err}");
    assert!(!exists(&server, &key));
    read.release().await.unwrap();

    let write = rw.write().acquire().await.unwrap();
    // A read taken inside the write lock shares its owner, and still cannot write.
    let read_within = write.read_within().await.unwrap();
    let err = read_within.write_if_held(&writes).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UnsupportedGuard, "{err}");
    assert!(!exists(&server, &key));
    assert!(write.write_if_held(&writes).await.unwrap());
    assert_eq!(server.cmd::<String>(&["GET", &key]), "text");

    // A fair lock writes as an exclusive one does.
    let fair = locks.fair_lock("queue-1").unwrap().acquire().await.unwrap();
    let counter = format!("count:{}", fair.hash_tag());
    let incr = GuardedWrites::new().command("INCRBY", &counter, ["2"]);
    assert!(fair.write_if_held(&incr).await.unwrap());
    assert_eq!(server.cmd::<i64>(&["GET", &counter]), 2);
}

#[tokio::test]
async fn the_librarys_own_keys_cannot_be_written() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let lock = locks.lock("own").unwrap();
    let guard = lock.acquire().await.unwrap();
    for own in [lock.keys().hash(), lock.keys().queue(), "lock:epoch"] {
        let err = guard
            .write_if_held(&GuardedWrites::new().del(own))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidName, "{own}: {err}");
    }
    assert!(lock.is_locked().await.unwrap(), "the lock is untouched");
    assert!(exists(&server, "lock:epoch"));
}

/// A client of `cluster` with the default settings.
async fn cluster_client(cluster: &RedisCluster) -> LockClient {
    LockClient::builder_cluster(cluster.urls())
        .build()
        .await
        .expect("cluster client")
}

/// Whether `key` exists on the master that serves its slot.
fn exists_on_cluster(cluster: &RedisCluster, key: &str) -> bool {
    cluster.cmd::<i64>(cluster.node_of(key), &["EXISTS", key]) == 1
}

#[tokio::test(flavor = "multi_thread")]
async fn on_a_cluster_keys_in_the_locks_slot_apply_and_a_key_elsewhere_is_refused_before_anything_is_written()
 {
    let cluster = RedisCluster::start(3);
    cluster.provision_epochs().await;
    let locks = cluster_client(&cluster).await;
    let guard = locks.lock("account-12").unwrap().acquire().await.unwrap();
    let tag = guard.hash_tag();
    let (balance, limit) = (format!("balance:{tag}"), format!("limit:{tag}"));
    assert_eq!(
        cluster.slot_of(&balance),
        cluster.slot_of("lock:{account-12}")
    );

    assert!(
        guard
            .write_if_held(&GuardedWrites::new().set(&balance, "70"))
            .await
            .unwrap()
    );
    let node = cluster.node_of(&balance);
    assert_eq!(cluster.cmd::<String>(node, &["GET", &balance]), "70");

    let elsewhere = "balance:account-12";
    assert_ne!(cluster.slot_of(elsewhere), cluster.slot_of(&balance));
    let writes = GuardedWrites::new().set(&limit, "500").set(elsewhere, "70");
    let err = guard.write_if_held(&writes).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::WrongSlot, "{err}");
    assert!(!exists_on_cluster(&cluster, &limit), "nothing was written");
    assert!(!exists_on_cluster(&cluster, elsewhere));
}

/// In a slot left half migrated a guarded write runs on no node: it is refused as Redis
/// unavailable for now, nothing is written on either node, and it lands on the new owner
/// once the operator finishes the migration.
#[tokio::test(flavor = "multi_thread")]
async fn in_a_slot_left_half_migrated_writes_are_refused_and_land_once_it_is_finished() {
    let cluster = RedisCluster::start(3);
    cluster.provision_epochs().await;
    let (holder, operator) = (
        cluster_client(&cluster).await,
        cluster_client(&cluster).await,
    );
    let guard = holder.lock("ledger-2").unwrap().acquire().await.unwrap();
    let balance = format!("balance:{}", guard.hash_tag());
    assert!(
        guard
            .write_if_held(&GuardedWrites::new().set(&balance, "100"))
            .await
            .unwrap()
    );

    // A resharding that died half way: the data went to the new master, the lock stayed.
    let from = cluster.node_of(&balance);
    let to = cluster.other_master(from);
    let slot = cluster.slot_of(&balance);
    cluster.start_migration(slot, from, to, &[&balance]);
    let on_both = |cluster: &RedisCluster| {
        (
            cluster.keys_in_slot(from, slot),
            cluster.cmd_asking::<String>(to, &["GET", &balance]),
        )
    };
    let before = on_both(&cluster);

    let err = guard
        .write_if_held(&GuardedWrites::new().set(&balance, "120"))
        .await
        .expect_err("a write ran in a migrating slot");
    assert_eq!(err.kind(), ErrorKind::RedisUnavailable, "{err}");
    let err = operator
        .lock("ledger-2")
        .unwrap()
        .force_unlock()
        .await
        .expect_err("a force-unlock ran in a migrating slot");
    assert_eq!(err.kind(), ErrorKind::RedisUnavailable, "{err}");
    assert_eq!(on_both(&cluster), before, "written while the slot migrates");

    cluster.finish_migration(slot, from, to);
    assert!(
        guard
            .write_if_held(&GuardedWrites::new().set(&balance, "120"))
            .await
            .unwrap()
    );
    assert_eq!(cluster.cmd::<String>(to, &["GET", &balance]), "120");
    assert!(cluster.keys_in_slot(from, slot).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn with_replica_acknowledgement_applied_writes_are_on_the_replica_or_reported_behind() {
    let master = RedisServer::start();
    let link = FaultProxy::start(master.port()).await;
    let replica = master.start_replica(link.port());
    let locks = LockClient::builder(&master.url())
        .min_replicas_acked(1, Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    let guard = locks.lock("payout-1").unwrap().acquire().await.unwrap();
    let key = format!("paid:{}", guard.hash_tag());

    assert!(
        guard
            .write_if_held(&GuardedWrites::new().set(&key, "yes"))
            .await
            .unwrap()
    );
    assert_eq!(
        replica.cmd::<Option<String>>(&["GET", &key]).as_deref(),
        Some("yes"),
        "reported applied before the replica had it"
    );

    // The replica lags: applied on the master, but reported behind.
    link.black_hole();
    let writes = GuardedWrites::new().set(&key, "twice");
    let err = guard.write_if_held(&writes).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ReplicasBehind, "{err}");
    assert_eq!(master.cmd::<String>(&["GET", &key]), "twice");
    link.heal();
}

/// The rules of the security chapter's ACL line for the library (`~lock:* &lock:wake:* -@all
/// +…`), with `password`.
fn documented_acl_rules(password: &str) -> Vec<String> {
    let chapter = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src/guide/security.md"
    ))
    .expect("the security chapter");
    let line = chapter
        .lines()
        .find_map(|line| line.strip_prefix("ACL SETUSER locker "))
        .expect("the security chapter shows the ACL line");
    line.split_whitespace()
        .map(|rule| match rule {
            ">CHANGE-ME" => format!(">{password}"),
            rule => rule.to_owned(),
        })
        .collect()
}

#[tokio::test]
async fn an_acl_user_of_the_documented_line_checks_the_lock_and_writes_the_keys_it_is_granted() {
    let server = RedisServer::start();
    let mut rules = documented_acl_rules("pw");
    rules.extend(["~balance:*".to_owned(), "+rpush".to_owned()]);
    let mut args = vec!["ACL", "SETUSER", "writer"];
    args.extend(rules.iter().map(String::as_str));
    let () = server.cmd(&args);
    let locks = LockClient::connect(&server.url_as("writer", "pw"))
        .await
        .unwrap();
    let guard = locks.lock("acct-1").unwrap().acquire().await.unwrap();
    let tag = guard.hash_tag();

    let (balance, history) = (format!("balance:{tag}"), format!("balance:history:{tag}"));
    let writes = GuardedWrites::new()
        .set(&balance, "5")
        .command("RPUSH", &history, ["+5"]);
    assert!(guard.write_if_held(&writes).await.unwrap());
    assert_eq!(server.cmd::<String>(&["GET", &balance]), "5");

    // A key the user is not granted: refused before the script runs.
    let other = format!("other:{tag}");
    let err = guard
        .write_if_held(&GuardedWrites::new().set(&other, "5"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AccessDenied, "{err}");
    assert!(!exists(&server, &other));
}
