//! Locks on a real Redis Cluster of three masters: every script stays in its lock's slot,
//! wake-ups travel by sharded pub/sub on the slot's node, and an instance listens on one
//! connection per node however many locks it waits for.

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use support::cluster::RedisCluster;
use tokio::sync::Mutex;
use tower_redis_lock::LockClient;
use tower_redis_lock::kinds::MultiLock;

/// Generous bound for what should take milliseconds (shared, busy machines).
const PROMPTLY: Duration = Duration::from_secs(10);

/// A client of `cluster` that re-polls only every minute: a waiter served sooner than that
/// was woken by its grant. Its command timeout is generous: a test sends 10,000 scripts at
/// once, on a shared 2-core machine that runs other clusters' tests meanwhile.
async fn client(cluster: &RedisCluster) -> LockClient {
    LockClient::builder_cluster(cluster.urls())
        .repoll_interval(Duration::from_secs(60))
        .command_timeout(Duration::from_secs(10))
        .build()
        .await
        .expect("cluster client")
}

/// A cluster whose every slot has its epoch, as an operator gives a new cluster.
async fn provisioned_cluster() -> RedisCluster {
    let cluster = RedisCluster::start(3);
    cluster.provision_epochs().await;
    assert_eq!(cluster.keys(), 16384, "one epoch key per slot");
    cluster
}

#[tokio::test(flavor = "multi_thread")]
async fn mutual_exclusion_and_fencing_hold_on_keys_spread_over_every_node() {
    let cluster = provisioned_cluster().await;
    let names: Vec<String> = (0..24).map(|n| format!("tenant-{n}")).collect();
    let nodes: HashSet<u16> = names
        .iter()
        .map(|name| cluster.node_of(&format!("lock:{{{name}}}")))
        .collect();
    assert_eq!(nodes.len(), 3, "the keys do not reach every node");

    let clients = [
        client(&cluster).await,
        client(&cluster).await,
        client(&cluster).await,
    ];
    let in_use: Arc<HashMap<String, AtomicBool>> = Arc::new(
        names
            .iter()
            .map(|name| (name.clone(), AtomicBool::new(false)))
            .collect(),
    );
    let tokens: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let mut tasks = Vec::new();
    for (index, locks) in clients.iter().enumerate() {
        for worker in 0..4 {
            let locks = locks.clone();
            let names = names.clone();
            let in_use = in_use.clone();
            let tokens = tokens.clone();
            tasks.push(tokio::spawn(async move {
                for round in 0..30 {
                    let name = &names[(index * 7 + worker * 3 + round) % names.len()];
                    let guard = locks
                        .lock(name)
                        .unwrap()
                        .acquire_timeout(PROMPTLY * 3)
                        .await
                        .expect("acquired");
                    let flag = &in_use[name];
                    assert!(!flag.swap(true, Ordering::SeqCst), "two holders of {name}");
                    {
                        let mut tokens = tokens.lock().await;
                        let last = tokens.entry(name.clone()).or_default();
                        assert!(guard.fencing_token() > *last, "token of {name} went back");
                        *last = guard.fencing_token();
                    }
                    tokio::task::yield_now().await;
                    flag.store(false, Ordering::SeqCst);
                    guard.release().await.expect("released");
                }
            }));
        }
    }
    for task in tasks {
        task.await.expect("a worker failed");
    }
    for locks in &clients {
        locks.shutdown().await;
    }
    // Nothing left but the epochs, the token counters, and keys that expire: the last granted
    // token blocks and the releases' traces.
    let left = cluster.lock_keys_left(&cluster.ports());
    assert!(left.is_empty(), "keys left: {left:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hand_over_wakes_the_waiter_through_sharded_pub_sub_on_the_slots_node() {
    let cluster = provisioned_cluster().await;
    let holder = client(&cluster).await;
    let waiter = client(&cluster).await;
    let node = cluster.node_of("lock:{order-1}");
    for port in cluster.ports() {
        let _: () = cluster.cmd(port, &["CONFIG", "RESETSTAT"]);
    }

    let held = holder.lock("order-1").unwrap().acquire().await.unwrap();
    let lock = waiter.lock("order-1").unwrap();
    let waiting = tokio::spawn(async move { lock.acquire().await });
    assert!(
        support::eventually(PROMPTLY, || {
            cluster.cmd::<i64>(node, &["ZCARD", "lock:{order-1}:queue"]) == 1
        })
        .await,
        "the waiter never queued"
    );
    held.release().await.unwrap();
    // Far sooner than the minute-long re-poll: the grant woke it.
    let granted = tokio::time::timeout(PROMPTLY, waiting)
        .await
        .expect("the waiter was not woken")
        .unwrap()
        .unwrap();
    assert!(granted.is_held());

    assert!(
        cluster.command_calls(node, "spublish") >= 1,
        "no SPUBLISH on the slot's node"
    );
    for port in cluster.ports() {
        assert_eq!(
            cluster.command_calls(port, "publish"),
            0,
            "a PUBLISH on node {port}"
        );
        if port != node {
            assert_eq!(
                cluster.command_calls(port, "spublish"),
                0,
                "SPUBLISH on node {port}"
            );
        }
    }
    granted.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_semaphore_hands_its_permits_to_waiters_of_other_instances_in_its_slot() {
    let cluster = provisioned_cluster().await;
    let holder = client(&cluster).await;
    let waiter = client(&cluster).await;
    let key = "lock:{exports}:semaphore";
    let node = cluster.node_of(key);
    assert_eq!(node, cluster.node_of("lock:{exports}"), "the lock's slot");
    for port in cluster.ports() {
        let _: () = cluster.cmd(port, &["CONFIG", "RESETSTAT"]);
    }

    let semaphore = holder.semaphore("exports", 2).unwrap();
    let held = semaphore.acquire_many(2).await.unwrap();
    let waiting: Vec<_> = (0..2)
        .map(|_| {
            let semaphore = waiter.semaphore("exports", 2).unwrap();
            tokio::spawn(async move { semaphore.acquire().await })
        })
        .collect();
    assert!(
        support::eventually(PROMPTLY, || {
            cluster.cmd::<i64>(node, &["ZCARD", "lock:{exports}:semaphore:queue"]) == 2
        })
        .await,
        "the waiters never queued"
    );
    held.release().await.unwrap();
    // Far sooner than the minute-long re-poll: one release granted both, by their messages.
    for waiting in waiting {
        let granted = tokio::time::timeout(PROMPTLY, waiting)
            .await
            .expect("a waiter was not woken")
            .unwrap()
            .unwrap();
        assert!(granted.is_held());
        granted.release().await.unwrap();
    }
    assert!(
        cluster.command_calls(node, "spublish") >= 1,
        "no SPUBLISH on the slot's node"
    );
    for port in cluster.ports() {
        assert_eq!(
            cluster.command_calls(port, "publish"),
            0,
            "a PUBLISH on {port}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_holders_of_semaphores_on_every_node_never_share_a_fencing_token() {
    let cluster = provisioned_cluster().await;
    let clients = [
        client(&cluster).await,
        client(&cluster).await,
        client(&cluster).await,
    ];
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    // 40 semaphores of 3 permits, each wanted by 9 tasks of 3 instances at once: many
    // waiters learn of their grants only on their next look (their first wait in a slot
    // subscribes first), when later holders hold later tokens.
    for key in 0..40 {
        for locks in &clients {
            for _ in 0..3 {
                let semaphore = locks.semaphore(&format!("tenant-{key}"), 3).unwrap();
                let tokens = tokens.clone();
                tasks.push(tokio::spawn(async move {
                    for _ in 0..3 {
                        let guard = semaphore.acquire().await.unwrap();
                        tokens.lock().unwrap().push((key, guard.fencing_token()));
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        guard.release().await.unwrap();
                    }
                }));
            }
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    let mut tokens = Arc::try_unwrap(tokens).unwrap().into_inner().unwrap();
    let acquisitions = tokens.len();
    assert_eq!(acquisitions, 40 * 9 * 3);
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(
        tokens.len(),
        acquisitions,
        "two holders of one semaphore shared a token"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_heartbeat_keeps_places_in_many_slots_alive_one_script_per_slot() {
    let cluster = provisioned_cluster().await;
    let holder = client(&cluster).await;
    // Its watchdog, the waiters' heartbeat, ticks every second (a tenth of the bound below).
    let waiter = LockClient::builder_cluster(cluster.urls())
        .repoll_interval(Duration::from_secs(60))
        .command_timeout(Duration::from_secs(10))
        .renew_interval(Duration::from_secs(1))
        .build()
        .await
        .expect("cluster client");
    // Two locks in different slots of one node, and one on another node: the heartbeat must
    // not put them in one script (a cluster refuses a script whose keys span slots).
    let node = cluster.node_of("lock:{order-0}");
    let mut names: Vec<String> = (1..)
        .map(|n| format!("order-{n}"))
        .filter(|name| cluster.node_of(&format!("lock:{{{name}}}")) == node)
        .take(1)
        .collect();
    names.push("order-0".to_owned());
    names.extend(
        (1..)
            .map(|n| format!("order-{n}"))
            .find(|name| cluster.node_of(&format!("lock:{{{name}}}")) != node),
    );
    let terms = |name: &str| -> Option<String> {
        let key = format!("lock:{{{name}}}");
        cluster.cmd(
            cluster.node_of(&key),
            &["HGET", &format!("{key}:waiters"), &owner_of(&cluster, name)],
        )
    };
    fn owner_of(cluster: &RedisCluster, name: &str) -> String {
        let key = format!("lock:{{{name}}}:queue");
        let queued: Vec<String> = cluster.cmd(cluster.node_of(&key), &["ZRANGE", &key, "0", "0"]);
        queued.into_iter().next().unwrap_or_default()
    }
    let mut held = Vec::new();
    let mut waiting = Vec::new();
    for name in &names {
        held.push(holder.fair_lock(name).unwrap().acquire().await.unwrap());
        let lock = waiter.fair_lock(name).unwrap();
        waiting.push(tokio::spawn(async move { lock.acquire().await }));
    }
    assert!(
        support::eventually(PROMPTLY, || names.iter().all(|name| terms(name).is_some())).await,
        "the waiters never queued"
    );
    let first: Vec<Option<String>> = names.iter().map(|name| terms(name)).collect();
    // The waiters never re-poll within the test (a minute): their terms move only by the
    // heartbeat, once a second.
    assert!(
        support::eventually(PROMPTLY, || names
            .iter()
            .zip(&first)
            .all(|(name, first)| terms(name) != *first))
        .await,
        "a heartbeat did not refresh every place"
    );
    for guard in held {
        guard.release().await.unwrap();
    }
    for waiting in waiting {
        let guard = tokio::time::timeout(PROMPTLY, waiting)
            .await
            .expect("a waiter was not served")
            .unwrap()
            .unwrap();
        guard.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn thousands_of_awaited_keys_use_one_pub_sub_connection_per_node() {
    const KEYS: usize = 10_000;
    let cluster = provisioned_cluster().await;
    let holder = client(&cluster).await;
    let waiter = client(&cluster).await;
    let names: Vec<String> = (0..KEYS).map(|n| format!("account-{n}")).collect();

    let mut held = Vec::with_capacity(KEYS);
    for chunk in names.chunks(500) {
        let guards = futures_util::future::join_all(
            chunk
                .iter()
                .map(|name| async { holder.lock(name).unwrap().acquire().await }),
        )
        .await;
        held.extend(guards.into_iter().map(|guard| guard.expect("held")));
    }
    let waiting: Vec<_> = names
        .iter()
        .map(|name| {
            let lock = waiter.lock(name).unwrap();
            tokio::spawn(async move { lock.acquire().await })
        })
        .collect();
    // 10,000 looks through one cluster client: within a minute on a quiet machine, and
    // more than that on a busy one (CI once took longer on Valkey), so three are allowed.
    assert!(
        support::eventually(PROMPTLY * 18, || {
            cluster
                .ports()
                .iter()
                .map(|port| {
                    let queued: Vec<redis::Value> = cluster.cmd(*port, &["KEYS", "lock:*:queue"]);
                    queued.len()
                })
                .sum::<usize>()
                == KEYS
        })
        .await,
        "not every waiter queued"
    );
    let mut channels = 0;
    for port in cluster.ports() {
        let listeners: String = cluster.cmd(port, &["CLIENT", "LIST", "TYPE", "pubsub"]);
        assert!(
            listeners.lines().count() <= 1,
            "node {port} has {} pub/sub connections:\n{listeners}",
            listeners.lines().count()
        );
        let shard_channels: Vec<String> = cluster.cmd(port, &["PUBSUB", "SHARDCHANNELS"]);
        channels += shard_channels.len();
    }
    // One channel per slot waited in: 10,000 names hash to at most that many slots, and
    // never to more channels than slots.
    assert!(
        channels > 0 && channels <= KEYS.min(16384),
        "{channels} channels"
    );

    drop(held);
    for task in waiting {
        let guard = tokio::time::timeout(PROMPTLY * 6, task)
            .await
            .expect("a waiter was never served")
            .unwrap()
            .expect("acquired");
        drop(guard);
    }
    holder.shutdown().await;
    waiter.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_multi_lock_over_several_nodes_is_all_or_nothing() {
    let cluster = provisioned_cluster().await;
    let first = client(&cluster).await;
    let second = client(&cluster).await;
    let names = ["transfer-a", "transfer-b", "transfer-c", "transfer-d"];
    let nodes: HashSet<u16> = names
        .iter()
        .map(|name| cluster.node_of(&format!("lock:{{{name}}}")))
        .collect();
    assert!(nodes.len() > 1, "the locks should live on several nodes");
    let multi = move |locks: &LockClient| {
        MultiLock::new(names.iter().map(|name| locks.lock(name).unwrap()))
    };

    let held = multi(&first).acquire().await.unwrap();
    assert!(held.is_held());
    // One of the locks is taken: the other client gets none of them.
    assert!(multi(&second).try_acquire().await.unwrap().is_none());
    for name in names {
        let holders: i64 = cluster.cmd(
            cluster.node_of(&format!("lock:{{{name}}}")),
            &["HLEN", &format!("lock:{{{name}}}")],
        );
        assert_eq!(holders, 1, "{name} has {holders} holders");
    }
    let waiting = tokio::spawn(async move { multi(&second).acquire().await.map(|_| ()) });
    held.release().await.unwrap();
    tokio::time::timeout(PROMPTLY, waiting)
        .await
        .expect("the second multi-lock was not granted")
        .unwrap()
        .unwrap();
}

/// `lockctl --cluster --url <seed> ...` followed by `args`, its output piped.
fn lockctl(cluster: &RedisCluster, args: &[&str]) -> std::process::Child {
    let mut command = std::process::Command::new(support::lockctl_path());
    command.arg("--cluster");
    for url in cluster.urls() {
        command.arg("--url").arg(url);
    }
    command
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("lockctl starts")
}

/// Runs lockctl to the end: its exit code and its last event.
fn lockctl_run(cluster: &RedisCluster, args: &[&str]) -> (i32, serde_json::Value) {
    support::lockctl_outcome(lockctl(cluster, args))
}

#[test]
fn lockctl_waives_holds_inspects_and_force_unlocks_on_a_cluster() {
    use std::io::BufRead;

    let cluster = RedisCluster::start(3);
    let (code, waived) = lockctl_run(&cluster, &["waive-quarantine"]);
    assert_eq!((code, &waived["waived"]), (0, &serde_json::json!(true)));
    assert_eq!(cluster.keys(), 16384, "one epoch per slot");

    let mut holder = lockctl(&cluster, &["hold", "order-7", "--for", "60s"]);
    let mut events = std::io::BufReader::new(holder.stdout.take().expect("stdout"));
    let mut line = String::new();
    events.read_line(&mut line).expect("the acquired event");
    let acquired: serde_json::Value = serde_json::from_str(&line).expect("JSON");
    assert_eq!(acquired["event"], "acquired", "{line}");

    let (code, inspected) = lockctl_run(&cluster, &["inspect", "order-7", "--json"]);
    assert_eq!(code, 0);
    assert_eq!(inspected["locked"], true, "{inspected}");
    assert_eq!(inspected["hold_count"], 1, "{inspected}");
    // Taken free, its tokens came from the server clock: no counter.
    assert_eq!(inspected["fence"], serde_json::Value::Null, "{inspected}");
    assert!(acquired["token"].as_u64().is_some(), "{line}");

    let (code, unlocked) = lockctl_run(&cluster, &["force-unlock", "order-7", "--yes", "--json"]);
    assert_eq!((code, &unlocked["removed"]), (0, &serde_json::json!(true)));
    // The holder's next renewal finds the lock gone: it is told, and exits 4.
    let status = holder.wait().expect("the holder ends");
    assert_eq!(
        status.code(),
        Some(4),
        "the holder was not told its lock was taken"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockctl_lists_the_locks_of_every_master() {
    let cluster = provisioned_cluster().await;
    let names: Vec<String> = (0..12).map(|n| format!("tenant-{n}")).collect();
    let nodes: HashSet<u16> = names
        .iter()
        .map(|name| cluster.node_of(&format!("lock:{{{name}}}")))
        .collect();
    assert_eq!(nodes.len(), 3, "the keys do not reach every node");
    let locks = client(&cluster).await;
    let mut guards = Vec::new();
    for name in &names {
        guards.push(locks.lock(name).unwrap().acquire().await.unwrap());
    }
    for port in cluster.masters() {
        let _: () = cluster.cmd(port, &["CONFIG", "RESETSTAT"]);
    }
    let (listed, next) = lockctl_list(&cluster, &[]).await;
    assert_eq!(next, None);
    let mut wanted: Vec<String> = names.clone();
    wanted.sort_unstable();
    // The 16,384 epoch keys are no locks.
    assert_eq!(listed, wanted);
    for port in cluster.masters() {
        assert!(
            cluster.command_calls(port, "scan") >= 1,
            "master {port} was not scanned"
        );
    }
    // Pages of 5 go on from master to master: each lock once.
    let mut paged = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..10 {
        let mut args = vec!["--limit", "5"];
        if let Some(cursor) = &cursor {
            args.extend(["--cursor", cursor.as_str()]);
        }
        let (listed, next) = lockctl_list(&cluster, &args).await;
        assert!(listed.len() <= 5);
        paged.extend(listed);
        cursor = next;
        if cursor.is_none() {
            break;
        }
    }
    assert_eq!(cursor, None, "the listing never ended");
    paged.sort_unstable();
    assert_eq!(paged, wanted);
}

/// `lockctl --cluster ... list --json ARGS`: the names of the locks of one page, sorted, and
/// its next cursor.
async fn lockctl_list(cluster: &RedisCluster, args: &[&str]) -> (Vec<String>, Option<String>) {
    let mut command = tokio::process::Command::new(support::lockctl_path());
    command.arg("--cluster");
    for url in cluster.urls() {
        command.arg("--url").arg(url);
    }
    let output = command
        .args(["list", "--json"])
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("lockctl runs");
    let stdout = String::from_utf8(output.stdout).expect("UTF-8 output");
    assert!(output.status.success(), "{stdout}");
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("JSON"))
        .collect();
    let (page, locks) = lines.split_last().expect("the page line");
    let mut names: Vec<String> = locks
        .iter()
        .map(|lock| lock["name"].as_str().expect("a name").to_owned())
        .collect();
    names.sort_unstable();
    (names, page["next_cursor"].as_str().map(str::to_owned))
}

#[tokio::test]
async fn unusable_cluster_and_sentinel_settings_are_refused() {
    let no_seeds = LockClient::builder_cluster(Vec::<String>::new())
        .build()
        .await;
    let bad_seed = LockClient::builder_cluster(["not a url"]).build().await;
    let certificates_on_a_cluster = LockClient::builder_cluster(["redis://127.0.0.1:1"])
        .tls_root_certificate(b"-----BEGIN CERTIFICATE-----".to_vec())
        .build()
        .await;
    let no_sentinels = LockClient::builder_sentinel(Vec::<String>::new(), "locks")
        .build()
        .await;
    let bad_sentinel = LockClient::builder_sentinel(["not a url"], "locks")
        .build()
        .await;
    let certificates_on_a_sentinel = LockClient::builder_sentinel(["redis://127.0.0.1:1"], "locks")
        .tls_root_certificate(b"-----BEGIN CERTIFICATE-----".to_vec())
        .build()
        .await;
    for (what, built) in [
        ("no seeds", no_seeds),
        ("a bad seed", bad_seed),
        ("certificates on a cluster", certificates_on_a_cluster),
        ("no sentinels", no_sentinels),
        ("a bad sentinel URL", bad_sentinel),
        ("certificates on a sentinel", certificates_on_a_sentinel),
    ] {
        let err = built.expect_err(what);
        assert_eq!(
            err.kind(),
            tower_redis_lock::ErrorKind::InvalidConfig,
            "{what}: {err}"
        );
    }
}
