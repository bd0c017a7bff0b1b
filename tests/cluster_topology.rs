//! A cluster that changes under held and awaited locks: a slot that migrates to another
//! master (also one left half migrated, and one whose migration is aborted), a planned
//! failover, and a master killed and replaced by its replica.

mod support;

use std::time::Duration;

use support::cluster::RedisCluster;
use tower_redis_lock::{LockClient, LockGuard};

/// The watchdog lease of these tests: renewed every 2 s, and long enough to ride through a
/// failover.
const LEASE: Duration = Duration::from_secs(6);
/// Generous bound for what should take a second or two (shared, busy machines).
const PROMPTLY: Duration = Duration::from_secs(20);
const NAME: &str = "order-1";
const KEY: &str = "lock:{order-1}";

/// A client that re-polls only every minute: a waiter served sooner was woken by its grant.
async fn client(cluster: &RedisCluster) -> LockClient {
    client_with_lease(cluster, LEASE).await
}

/// [`client`] with another watchdog lease, which is also how long its queued waiters ride out
/// a look Redis refuses.
async fn client_with_lease(cluster: &RedisCluster, lease: Duration) -> LockClient {
    LockClient::builder_cluster(cluster.urls())
        .watchdog_lease(lease)
        .repoll_interval(Duration::from_secs(60))
        .build()
        .await
        .expect("cluster client")
}

/// A lock held by one client and awaited by another (queued in Redis).
async fn held_and_awaited(
    cluster: &RedisCluster,
    holder: &LockClient,
    waiter: &LockClient,
) -> (
    LockGuard,
    tokio::task::JoinHandle<tower_redis_lock::Result<LockGuard>>,
) {
    let held = holder.lock(NAME).unwrap().acquire().await.unwrap();
    let lock = waiter.lock(NAME).unwrap();
    let waiting = tokio::spawn(async move { lock.acquire().await });
    let node = cluster.node_of(KEY);
    assert!(
        support::eventually(PROMPTLY, || {
            cluster.cmd::<i64>(node, &["ZCARD", "lock:{order-1}:queue"]) == 1
        })
        .await,
        "the waiter never queued"
    );
    (held, waiting)
}

/// Waits until the lock's master shows a renewal newer than now: its lease is back above
/// what a renewal leaves after a third of it went by.
async fn renewed_on(cluster: &RedisCluster, node: u16) -> bool {
    tokio::time::sleep(LEASE / 2).await;
    support::eventually(PROMPTLY, || {
        cluster
            .cmd::<i64>(node, &["PTTL", KEY])
            .gt(&((LEASE / 2).as_millis() as i64))
    })
    .await
}

/// The holder still holds; the waiter is served only once it releases, woken by the grant.
async fn hand_over(
    held: LockGuard,
    waiting: tokio::task::JoinHandle<tower_redis_lock::Result<LockGuard>>,
) {
    assert!(held.is_held(), "{:?}", held.lost_signal().reason());
    if waiting.is_finished() {
        match waiting.await.expect("the waiter's task") {
            Ok(_) => panic!("a second holder while the first holds"),
            Err(error) => panic!("the waiter gave up while the lock was held: {error:?}"),
        }
    }
    let token = held.fencing_token();
    held.release().await.expect("released");
    let granted = tokio::time::timeout(PROMPTLY, waiting)
        .await
        .expect("the waiter was not woken by the grant")
        .unwrap()
        .expect("acquired");
    assert!(granted.fencing_token() > token);
    granted.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_held_and_awaited_lock_follows_its_slot_to_another_master() {
    let cluster = RedisCluster::start(3);
    cluster.provision_epochs().await;
    let (holder, waiter) = (client(&cluster).await, client(&cluster).await);
    let (held, waiting) = held_and_awaited(&cluster, &holder, &waiter).await;

    let from = cluster.node_of(KEY);
    let to = cluster.other_master(from);
    cluster.migrate_slot(cluster.slot_of(KEY), from, to);
    assert_eq!(cluster.node_of(KEY), to);
    // The epoch went with the slot: no loss, and the renewals go to the new master.
    assert!(
        renewed_on(&cluster, to).await,
        "the renewals did not follow the slot"
    );
    for port in cluster.ports() {
        let _: () = cluster.cmd(port, &["CONFIG", "RESETSTAT"]);
    }
    hand_over(held, waiting).await;
    assert!(
        cluster.command_calls(to, "spublish") >= 1,
        "no SPUBLISH on the new master"
    );
    assert_eq!(cluster.command_calls(from, "spublish"), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_planned_failover_keeps_every_lock() {
    let cluster = RedisCluster::start_with_replicas(3, 1);
    cluster.provision_epochs().await;
    let (holder, waiter) = (client(&cluster).await, client(&cluster).await);
    let (held, waiting) = held_and_awaited(&cluster, &holder, &waiter).await;

    let master = cluster.node_of(KEY);
    let replica = cluster.replica_of(master);
    assert!(
        cluster.planned_failover(replica).await,
        "the replica never took over"
    );
    assert!(
        support::eventually(PROMPTLY, || cluster.node_of(KEY) == replica).await,
        "the slot never moved to the promoted replica"
    );
    assert!(
        renewed_on(&cluster, replica).await,
        "the renewals did not follow the failover"
    );
    hand_over(held, waiting).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_master_replaced_by_an_up_to_date_replica_keeps_its_locks() {
    let mut cluster = RedisCluster::start_with_replicas(3, 1);
    cluster.provision_epochs().await;
    let (holder, waiter) = (client(&cluster).await, client(&cluster).await);
    let (held, waiting) = held_and_awaited(&cluster, &holder, &waiter).await;

    let master = cluster.node_of(KEY);
    let replica = cluster.replica_of(master);
    // The replica has every write, the lock and the queue included.
    let acked: i64 = cluster.cmd(master, &["WAIT", "1", "5000"]);
    assert_eq!(acked, 1);
    cluster.kill(master);
    let _: () = cluster.cmd(replica, &["CLUSTER", "FAILOVER", "TAKEOVER"]);
    assert!(
        support::eventually(PROMPTLY, || cluster.node_of(KEY) == replica).await,
        "the slot never moved to the promoted replica"
    );
    assert!(
        renewed_on(&cluster, replica).await,
        "the renewals did not follow the takeover"
    );
    hand_over(held, waiting).await;
}

/// A client whose watchdog lease outlasts the migrations these tests leave open: its holder
/// keeps the lease it has while its slot migrates, and must still hold when the slot is
/// stable again.
async fn patient_client(urls: Vec<String>) -> LockClient {
    LockClient::builder_cluster(urls)
        .watchdog_lease(PATIENT_LEASE)
        .build()
        .await
        .expect("cluster client")
}

/// The lease of [`patient_client`]: renewed every 10 s, so one renewal at least is refused
/// in a migration left open for [`OPEN_FOR`], and the lease left then is still 15 s or more.
const PATIENT_LEASE: Duration = Duration::from_secs(30);
const OPEN_FOR: Duration = Duration::from_secs(11);

/// What the nodes of a migrating slot hold of it, and what a second client gets while it
/// migrates: nothing granted, nothing written to the importing node.
async fn nothing_granted_or_written_while_open(
    cluster: &RedisCluster,
    other: &LockClient,
    to: u16,
    moved: usize,
) {
    let slot = cluster.slot_of(KEY).to_string();
    let err = other
        .lock(NAME)
        .unwrap()
        .try_acquire()
        .await
        .expect_err("a lock granted in a migrating slot");
    assert_eq!(
        err.kind(),
        tower_redis_lock::ErrorKind::RedisUnavailable,
        "{err}"
    );
    let on_importing: i64 = cluster.cmd(to, &["CLUSTER", "COUNTKEYSINSLOT", &slot]);
    assert_eq!(
        on_importing,
        moved as i64,
        "the library wrote to the node importing the slot: {:?}",
        cluster.keys_in_slot(to, cluster.slot_of(KEY))
    );
}

/// A slot left half migrated (the epoch moved by the operator, the lock and its queue not):
/// no script of its locks runs on either node, so nothing is granted or written, and the
/// holder keeps the lease it had (its renewals are refused, not moved elsewhere). Once the
/// operator finishes, the renewals go on at the new owner and the waiter is served.
#[tokio::test(flavor = "multi_thread")]
async fn a_slot_left_half_migrated_grants_and_writes_nothing_and_its_holder_keeps_its_lease() {
    let cluster = RedisCluster::start(3);
    cluster.provision_epochs().await;
    let holder = patient_client(cluster.urls()).await;
    // Its waiter rides out a look refused in the migrating slot (a pub/sub reconnection on a
    // busy machine makes one) for longer than the slot stays open: the test sees what the
    // migration does to its wait, not the end of a ride-out.
    let waiter = client_with_lease(&cluster, PATIENT_LEASE).await;
    let other = client(&cluster).await;
    let (held, waiting) = held_and_awaited(&cluster, &holder, &waiter).await;
    let lost = held.lost_signal();

    let from = cluster.node_of(KEY);
    let to = cluster.other_master(from);
    let slot = cluster.slot_of(KEY);
    let keys = cluster.keys_in_slot(from, slot);
    let moved: Vec<&str> = keys
        .iter()
        .map(String::as_str)
        .filter(|key| !key.starts_with(KEY))
        .collect();
    assert!(
        !moved.is_empty(),
        "the slot's epoch is there to move: {keys:?}"
    );
    let pttl_before: i64 = cluster.cmd(from, &["PTTL", KEY]);
    cluster.start_migration(slot, from, to, &moved);
    let opened = std::time::Instant::now();
    nothing_granted_or_written_while_open(&cluster, &other, to, moved.len()).await;
    tokio::time::sleep(OPEN_FOR.saturating_sub(opened.elapsed())).await;
    // The lease stayed where it was: counted down, not renewed, on the node that owns it.
    let pttl_open: i64 = cluster.cmd(from, &["PTTL", KEY]);
    assert!(
        pttl_open > 0 && pttl_open < pttl_before,
        "the lease on the owner went from {pttl_before} ms to {pttl_open} ms"
    );
    nothing_granted_or_written_while_open(&cluster, &other, to, moved.len()).await;
    assert_eq!(lost.reason(), None, "told lost while its lease runs");
    if waiting.is_finished() {
        let outcome = waiting.await.expect("the waiter's task");
        panic!("the waiter's acquire ended while the slot migrated: {outcome:?}");
    }

    cluster.finish_migration(slot, from, to);
    assert_eq!(cluster.node_of(KEY), to);
    assert!(
        support::eventually(PROMPTLY, || {
            cluster.cmd::<i64>(to, &["PTTL", KEY]) > pttl_open
        })
        .await,
        "the renewals did not go on at the new owner"
    );
    assert_eq!(lost.reason(), None);
    hand_over(held, waiting).await;
}

/// The operator opens a migration of a held lock's slot, moves no key, and aborts it the
/// documented way (`CLUSTER SETSLOT … STABLE` on both nodes). Before, the holder's renewal
/// moved the lock and the slot's epoch to the importing node; the abort stranded them there
/// (no expiry, `BUSYKEY` for every later migration), and the owner, with no epoch, granted
/// the lock at once to another client. Now nothing leaves the owner: the holder still holds,
/// another client is refused, the importing node holds nothing, and a later migration moves
/// the slot whole.
#[tokio::test(flavor = "multi_thread")]
async fn a_migration_aborted_by_the_operator_strands_nothing_and_grants_nothing_twice() {
    let cluster = RedisCluster::start(3);
    cluster.provision_epochs().await;
    let (holder, other) = (patient_client(cluster.urls()).await, client(&cluster).await);
    let held = holder.lock(NAME).unwrap().acquire().await.unwrap();
    let lost = held.lost_signal();
    let from = cluster.node_of(KEY);
    let to = cluster.other_master(from);
    let slot = cluster.slot_of(KEY);
    let slot_arg = slot.to_string();

    cluster.start_migration(slot, from, to, &[]);
    let opened = std::time::Instant::now();
    nothing_granted_or_written_while_open(&cluster, &other, to, 0).await;
    tokio::time::sleep(OPEN_FOR.saturating_sub(opened.elapsed())).await;
    // Counted down, not renewed, while the slot migrated.
    let pttl_open: i64 = cluster.cmd(from, &["PTTL", KEY]);
    for port in [from, to] {
        let () = cluster.cmd(port, &["CLUSTER", "SETSLOT", &slot_arg, "STABLE"]);
    }

    let on_importing: i64 = cluster.cmd(to, &["CLUSTER", "COUNTKEYSINSLOT", &slot_arg]);
    assert_eq!(
        on_importing, 0,
        "keys stranded on the node the slot never went to"
    );
    assert!(
        other
            .lock(NAME)
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .is_none(),
        "granted a second time after the abort"
    );
    assert!(
        support::eventually(PROMPTLY, || {
            cluster.cmd::<i64>(from, &["PTTL", KEY]) > pttl_open
        })
        .await,
        "the renewals did not go on at the owner"
    );
    assert_eq!(lost.reason(), None, "told lost by an aborted migration");
    let token = held.fencing_token();
    held.release().await.unwrap();
    let next = other.lock(NAME).unwrap().try_acquire().await.unwrap();
    assert!(next.expect("free once released").fencing_token() > token);

    // The slot moves whole later: nothing of it waits on the other node to collide with.
    cluster.migrate_slot(slot, from, to);
    assert_eq!(cluster.node_of(KEY), to);
    let left: i64 = cluster.cmd(from, &["CLUSTER", "COUNTKEYSINSLOT", &slot_arg]);
    assert_eq!(left, 0);
}

/// A name whose lock lives on the master on `port`, and one whose lock lives elsewhere.
fn names_on_and_off(cluster: &RedisCluster, port: u16) -> (String, String) {
    let name_on = |wanted: bool| {
        (0..)
            .map(|n| format!("account-{n}"))
            .find(|name| (cluster.node_of(&format!("lock:{{{name}}}")) == port) == wanted)
            .expect("a name")
    };
    (name_on(true), name_on(false))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_master_that_lost_its_data_quarantines_and_tells_only_its_own_slots() {
    let mut cluster = RedisCluster::start(3);
    cluster.provision_epochs().await;
    let locks = client(&cluster).await;
    let other = client(&cluster).await;
    let lost_node = cluster.masters()[0];
    let (on_lost_node, elsewhere) = names_on_and_off(&cluster, lost_node);
    let doomed = locks.lock(&on_lost_node).unwrap().acquire().await.unwrap();
    let spared = locks.lock(&elsewhere).unwrap().acquire().await.unwrap();

    // The master dies and comes back at once, empty (no persistence), still owning its
    // slots: their data and their epochs are gone.
    cluster.kill(lost_node);
    cluster.restart(lost_node);
    assert!(
        support::eventually(PROMPTLY, || cluster.answers(lost_node)).await,
        "the restarted master does not answer"
    );

    // Only the holder of the lost slot is told, with the reason.
    let reason = tokio::time::timeout(PROMPTLY, doomed.lost_signal().lost())
        .await
        .expect("the holder of the lost lock was not told");
    assert_eq!(reason, tower_redis_lock::LostReason::DataLost);
    assert!(spared.is_held(), "{:?}", spared.lost_signal().reason());

    // The lost slot waits out its quarantine; the others grant at once.
    assert!(
        other
            .lock(&on_lost_node)
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .is_none(),
        "the lost slot granted its lock again before the quarantine ended"
    );
    spared.release().await.unwrap();
    let again = other.lock(&elsewhere).unwrap().try_acquire().await.unwrap();
    assert!(again.is_some(), "a slot that lost nothing was quarantined");
}

#[tokio::test(flavor = "multi_thread")]
async fn each_slots_first_lock_waits_only_as_long_as_its_master_has_been_up_less_than_the_limit() {
    // No epoch is provisioned: each slot's first lock finds none.
    let mut cluster = RedisCluster::start(3);
    let limit = Duration::from_secs(4);
    let locks = LockClient::builder_cluster(cluster.urls())
        .lease_limit(limit)
        .watchdog_lease(Duration::from_secs(2))
        .build()
        .await
        .expect("cluster client");
    let masters = cluster.masters();
    for port in &masters {
        cluster.wait_until_up_for(*port, limit.as_secs() + 2);
    }
    // Up longer than the limit: the first lock of every slot is granted at once.
    for n in 0..30 {
        let name = format!("first-{n}");
        let guard = locks.lock(&name).unwrap().try_acquire().await.unwrap();
        assert!(
            guard.is_some(),
            "{name}'s slot was quarantined on a cluster up long enough"
        );
    }
    assert_eq!(locks.restart_quarantine_left(), None);

    // A master restarts empty, keeping its slots. A slot of it first used two seconds later
    // waits what is left of the limit since the master's start, not the whole limit.
    let restarted = masters[0];
    cluster.kill(restarted);
    cluster.restart(restarted);
    assert!(
        cluster.serving(restarted, PROMPTLY).await,
        "the restarted master does not serve its slots"
    );
    cluster.wait_until_up_for(restarted, 2);
    let mut unused = (0..)
        .map(|n| format!("later-{n}"))
        .filter(|name| cluster.node_of(&format!("lock:{{{name}}}")) == restarted);
    let soon = unused.next().unwrap();
    assert!(
        locks
            .lock(&soon)
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .is_none(),
        "a slot of the restarted master granted a lock before the limit passed"
    );
    let left = locks.restart_quarantine_left().expect("a quarantine runs");
    assert!(
        left <= limit - Duration::from_secs(1),
        "counted from the master's start, not from the slot's first use: {left:?}"
    );
    // Once the master has been up the limit, a slot first used then grants at once.
    cluster.wait_until_up_for(restarted, limit.as_secs() + 2);
    let later = unused.next().unwrap();
    let guard = locks.lock(&later).unwrap().try_acquire().await.unwrap();
    assert!(
        guard.is_some(),
        "a slot first used after the limit was quarantined"
    );
}

/// A cluster whose clients are an ACL user without the `MIGRATE` right: a migration the operator starts and finishes under
/// a held lock keeps it, and grants go on after it. Nothing of the library moves keys
/// between nodes, so no credentials pass from node to node.
#[tokio::test(flavor = "multi_thread")]
async fn a_migration_under_a_held_lock_needs_no_rights_beyond_the_librarys_own() {
    let cluster = RedisCluster::start(3);
    cluster.provision_epochs().await;
    for port in cluster.ports() {
        let () = cluster.cmd(
            port,
            &[
                "ACL",
                "SETUSER",
                "locker",
                "on",
                ">user-pass",
                "~*",
                "&*",
                "+@all",
                "-migrate",
            ],
        );
    }
    let urls: Vec<String> = cluster
        .urls()
        .iter()
        .map(|url| url.replacen("://", "://locker:user-pass@", 1))
        .collect();
    let locks = patient_client(urls).await;
    let held = locks.lock(NAME).unwrap().acquire().await.unwrap();
    let lost = held.lost_signal();
    let from = cluster.node_of(KEY);
    let to = cluster.other_master(from);
    let slot = cluster.slot_of(KEY);
    cluster.start_migration(slot, from, to, &[]);
    tokio::time::sleep(LEASE / 2).await;
    // Counted down, not renewed, while the slot migrated.
    let pttl_open: i64 = cluster.cmd(from, &["PTTL", KEY]);
    cluster.finish_migration(slot, from, to);
    assert!(
        support::eventually(PROMPTLY, || {
            cluster.cmd::<i64>(to, &["PTTL", KEY]) > pttl_open
        })
        .await,
        "the renewals did not follow the migration"
    );
    assert_eq!(lost.reason(), None);
    let token = held.fencing_token();
    held.release().await.unwrap();
    let again = tokio::time::timeout(PROMPTLY, locks.lock(NAME).unwrap().acquire())
        .await
        .expect("no grant after the migration")
        .unwrap();
    assert!(again.fencing_token() > token);
    again.release().await.unwrap();
}

/// Hand-overs go on through reshardings of their slot: two clients take and release the lock
/// in turn while the operator moves its slot from master to master, keys and all, as
/// `redis-cli --cluster reshard` does. A script that meets the slot migrating is tried again
/// within a third of a second, which outlasts such a move: no release is told `NotOwner`, no
/// error but Redis being unavailable for now is seen, every token is larger than the one
/// before, and the hand-overs go on after each move.
#[tokio::test(flavor = "multi_thread")]
async fn hand_overs_go_on_through_reshardings_of_their_slot() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    let cluster = RedisCluster::start(3);
    cluster.provision_epochs().await;
    let stop = Arc::new(AtomicBool::new(false));
    let tokens = Arc::new(Mutex::new(Vec::<u64>::new()));
    let unavailable = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut turns = Vec::new();
    for _ in 0..2 {
        let locks = client(&cluster).await;
        let (stop, tokens, unavailable) = (stop.clone(), tokens.clone(), unavailable.clone());
        turns.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let acquired = tokio::time::timeout(PROMPTLY, locks.lock(NAME).unwrap().acquire())
                    .await
                    .expect("no grant within the bound");
                let guard = match acquired {
                    Ok(guard) => guard,
                    Err(err) if err.kind() == tower_redis_lock::ErrorKind::RedisUnavailable => {
                        unavailable.lock().unwrap().push(format!("acquire: {err}"));
                        continue;
                    }
                    Err(err) => panic!("acquire: {err:?}"),
                };
                tokens.lock().unwrap().push(guard.fencing_token());
                match guard.release().await {
                    Ok(()) => {}
                    Err(err) if err.kind() == tower_redis_lock::ErrorKind::RedisUnavailable => {
                        unavailable.lock().unwrap().push(format!("release: {err}"));
                    }
                    Err(err) => panic!("release: {err:?}"),
                }
            }
            locks.shutdown().await;
        }));
    }

    let slot = cluster.slot_of(KEY);
    let mut served_before = 0;
    for _ in 0..4 {
        assert!(
            support::eventually(PROMPTLY, || tokens.lock().unwrap().len()
                > served_before + 20)
            .await,
            "the hand-overs stopped"
        );
        let from = cluster.node_of(KEY);
        let to = cluster.other_master(from);
        cluster.migrate_slot(slot, from, to);
        assert_eq!(cluster.node_of(KEY), to);
        served_before = tokens.lock().unwrap().len();
    }
    assert!(
        support::eventually(PROMPTLY, || tokens.lock().unwrap().len()
            > served_before + 20)
        .await,
        "the hand-overs stopped after the last move"
    );
    stop.store(true, Ordering::Relaxed);
    for turn in turns {
        turn.await.expect("a client's turns panicked");
    }

    let tokens = tokens.lock().unwrap();
    assert!(
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "tokens went back"
    );
    let unavailable = unavailable.lock().unwrap();
    println!(
        "{} hand-overs through 4 moves of their slot; unavailable for now: {unavailable:?}",
        tokens.len()
    );
}
