//! Scripts sent twice, on a cluster: when a connection drops after a script was sent and
//! before its reply came, redis-rs's cluster client sends the script again on a fresh
//! connection. Each test lets a script run in Redis while its reply is on its way, cuts the
//! connection, and checks that the second run changed nothing the first had not: no false
//! `NotOwner` for a last release, no second hold taken by a release before the last (which
//! would free a re-entered lock, or a read within a write lock, while a guard holds it), no
//! place left in the queue behind the lock an acquisition took, no guarded write applied
//! twice.

mod support;

use std::time::Duration;

use support::cluster::RedisCluster;
use support::eventually;
use support::proxy::FaultProxy;
use tokio::task::JoinHandle;
use tower_redis_lock::{GuardedWrites, LockClient, LockGuard, Result};

/// How long a reply takes through the proxy while a release runs: long enough to see the
/// release's effect in Redis and cut the connection before the reply arrives.
const REPLY_DELAY: Duration = Duration::from_millis(1000);

/// Generous bound for what the cluster does on its own (announcing a port, running a script
/// held back by `REPLY_DELAY`): these machines are shared and slow at times.
const SLACK: Duration = Duration::from_secs(10);

/// A 3-master cluster whose node owning `name`'s lock is reached through a proxy, and a
/// client of it whose commands wait long enough (10 s) for a delayed reply.
struct ThroughProxy {
    cluster: RedisCluster,
    node: u16,
    proxy: FaultProxy,
    locks: LockClient,
    /// Another client, reaching every node directly.
    other: LockClient,
}

impl ThroughProxy {
    async fn start(name: &str) -> Self {
        let cluster = RedisCluster::start(3);
        cluster.provision_epochs().await;
        let node = cluster.node_of(&format!("lock:{{{name}}}"));
        // The node is announced at a proxy's port, so clients reach it through the proxy.
        let proxy = FaultProxy::start(node).await;
        let bus = (node + 10000).to_string();
        let () = cluster.cmd(node, &["CONFIG", "SET", "cluster-announce-bus-port", &bus]);
        let announced = proxy.port().to_string();
        let () = cluster.cmd(
            node,
            &["CONFIG", "SET", "cluster-announce-port", &announced],
        );
        let at_proxy = format!("{:?}", redis::Value::Int(i64::from(proxy.port())));
        assert!(
            eventually(SLACK, || {
                cluster.masters().iter().all(|&master| {
                    let slots: redis::Value = cluster.cmd(master, &["CLUSTER", "SLOTS"]);
                    format!("{slots:?}").contains(&at_proxy)
                })
            })
            .await,
            "every node announces the node at the proxy"
        );
        let locks = LockClient::builder_cluster(vec![proxy.url()])
            .command_timeout(SLACK)
            .build()
            .await
            .unwrap();
        let other = LockClient::builder_cluster(vec![proxy.url()])
            .build()
            .await
            .unwrap();
        Self {
            cluster,
            node,
            proxy,
            locks,
            other,
        }
    }

    /// Runs `script` with replies held back, waits until `ran` says Redis ran it, and cuts
    /// every connection through the proxy before the reply arrives: redis-rs sends the
    /// script again. Returns what it answered.
    async fn cut_after_it_ran<T>(
        &self,
        script: JoinHandle<Result<T>>,
        ran: impl FnMut() -> bool,
    ) -> Result<T> {
        assert!(
            self.proxy.open_connections() > 0,
            "the client reaches the node through the proxy"
        );
        self.proxy.set_latency(REPLY_DELAY);
        assert!(eventually(SLACK, ran).await, "the script ran in Redis");
        self.proxy.set_latency(Duration::ZERO);
        assert!(self.proxy.cut_all() > 0, "a connection was cut");
        script.await.unwrap()
    }

    /// The other client's acquisition of `name`, once it waits in Redis (alone).
    async fn other_waits(&self, name: &str) -> JoinHandle<Result<LockGuard>> {
        let lock = self.other.lock(name).unwrap();
        let waiting = tokio::spawn(async move { lock.acquire().await });
        assert!(
            eventually(SLACK, || self.queue_length(name) == 1).await,
            "the other client waits in Redis"
        );
        waiting
    }

    /// How many wait for `name` in Redis.
    fn queue_length(&self, name: &str) -> i64 {
        let queue = format!("lock:{{{name}}}:queue");
        self.cluster.cmd(self.node, &["ZCARD", &queue])
    }

    /// The field `field` of the lock hash `key`, on the node that owns it.
    fn field(&self, key: &str, field: &str) -> Option<String> {
        self.cluster.cmd(self.node, &["HGET", key, field])
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_last_release_sent_again_answers_released_not_not_owner() {
    let name = "order-7";
    let key = format!("lock:{{{name}}}");
    let setup = ThroughProxy::start(name).await;
    let guard = setup.locks.lock(name).unwrap().acquire().await.unwrap();

    let release = tokio::spawn(guard.release());
    let answer = setup
        .cut_after_it_ran(release, || {
            setup.cluster.cmd::<i64>(setup.node, &["EXISTS", &key]) == 0
        })
        .await;
    assert!(
        answer.is_ok(),
        "the release took effect, and says so: {answer:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_release_sent_again_answers_released_and_frees_its_permit_once() {
    let name = "exports";
    let key = format!("lock:{{{name}}}:semaphore");
    let setup = ThroughProxy::start(name).await;
    let semaphore = setup.locks.semaphore(name, 2).unwrap();
    let held = semaphore.acquire().await.unwrap();
    let other = setup
        .other
        .semaphore(name, 2)
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let owner = held.owner_id().to_owned();

    let release = tokio::spawn(held.release());
    let answer = setup
        .cut_after_it_ran(release, || setup.field(&key, &owner).is_none())
        .await;
    assert!(
        answer.is_ok(),
        "the release took effect, and says so: {answer:?}"
    );
    assert_eq!(
        setup.field(&key, "used").as_deref(),
        Some("1"),
        "the other holder's permit is still counted"
    );
    other.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_of_a_reentered_lock_sent_again_leaves_it_held() {
    let name = "order-8";
    let key = format!("lock:{{{name}}}");
    let setup = ThroughProxy::start(name).await;
    let guard = setup.locks.lock(name).unwrap().acquire().await.unwrap();
    let reentered = guard.reenter().await.unwrap();
    let owner = guard.owner_id().to_owned();
    assert_eq!(setup.field(&key, &owner).as_deref(), Some("2"));

    let release = tokio::spawn(reentered.release());
    let answer = setup
        .cut_after_it_ran(release, || {
            setup.field(&key, &owner).as_deref() != Some("2")
        })
        .await;
    answer.expect("the release of one hold of two");

    // The first guard still holds the lock: Redis must still count it, and nobody else gets it.
    assert_eq!(
        setup.field(&key, &owner).as_deref(),
        Some("1"),
        "one hold is left in Redis"
    );
    let other = setup.other.lock(name).unwrap();
    let taken = other.try_acquire().await.unwrap();
    assert!(
        taken.is_none(),
        "another client took the lock while its first guard holds it"
    );
    assert!(guard.is_held());
    guard.release().await.unwrap();
    assert!(other.try_acquire().await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_of_a_read_within_sent_again_leaves_the_other_read_within() {
    let name = "order-9";
    let key = format!("lock:{{{name}}}");
    let setup = ThroughProxy::start(name).await;
    let rw = setup.locks.read_write_lock(name).unwrap();
    let written = rw.write().acquire().await.unwrap();
    let first_read = written.read_within().await.unwrap();
    let second_read = written.read_within().await.unwrap();
    let reads = format!("{}:r", written.owner_id());
    assert_eq!(setup.field(&key, &reads).as_deref(), Some("2"));

    let release = tokio::spawn(first_read.release());
    let answer = setup
        .cut_after_it_ran(release, || {
            setup.field(&key, &reads).as_deref() != Some("2")
        })
        .await;
    answer.expect("the release of one read within of two");
    assert_eq!(
        setup.field(&key, &reads).as_deref(),
        Some("1"),
        "the second read within is left in Redis"
    );

    // The write lock goes; the second read keeps the lock read, so no writer gets it.
    written.release().await.unwrap();
    let writer = setup.other.read_write_lock(name).unwrap().write();
    let taken = writer.try_acquire().await.unwrap();
    assert!(
        taken.is_none(),
        "another client wrote while a read within was held"
    );
    assert!(second_read.is_held());
    second_read.release().await.unwrap();
    assert!(writer.try_acquire().await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_sent_again_finds_the_lock_its_first_run_took() {
    let name = "order-10";
    let key = format!("lock:{{{name}}}");
    let setup = ThroughProxy::start(name).await;
    let lock = setup.locks.lock(name).unwrap();
    // Connected, and the script loaded, before replies are held back.
    lock.acquire().await.unwrap().release().await.unwrap();

    let acquire = tokio::spawn(async move { lock.acquire().await });
    setup.proxy.set_latency(REPLY_DELAY);
    assert!(
        eventually(SLACK, || setup
            .cluster
            .cmd::<i64>(setup.node, &["EXISTS", &key])
            == 1)
        .await,
        "the acquisition ran in Redis"
    );
    setup.proxy.set_latency(Duration::ZERO);
    assert!(setup.proxy.cut_all() > 0, "a connection was cut");
    // Sent again, the look must find the lock its first run took, not queue behind it: a
    // place left in the queue would be granted the lock at its release, and nobody would
    // hear of it for a whole lease.
    let guard = tokio::time::timeout(SLACK, acquire)
        .await
        .expect("acquired")
        .unwrap()
        .unwrap();
    assert_eq!(
        setup.field(&key, guard.owner_id()).as_deref(),
        Some("1"),
        "the guard's owner holds the lock in Redis"
    );
    assert_eq!(setup.queue_length(name), 0, "nobody is left in the queue");
    guard.release().await.unwrap();
    let next = setup.other.lock(name).unwrap().try_acquire().await.unwrap();
    assert!(next.is_some(), "the released lock is free for the next");
}

// One thread, so that a spawned task joins the client's local queue before the test goes on.
#[tokio::test(flavor = "current_thread")]
async fn a_hand_over_through_redis_sent_again_answers_passed_on_and_keeps_the_next_task_queued() {
    let name = "order-11";
    let key = format!("lock:{{{name}}}");
    let mut setup = ThroughProxy::start(name).await;
    // No local hand-over: a task of this client that waits gets the lock through Redis.
    setup.locks = LockClient::builder_cluster(vec![setup.proxy.url()])
        .command_timeout(SLACK)
        .local_handover_limit(0)
        .build()
        .await
        .unwrap();
    let lock = setup.locks.lock(name).unwrap();
    let spawn_acquire = || {
        let lock = lock.clone();
        tokio::spawn(async move { lock.acquire().await })
    };

    // Before replies are held back: this client waits in Redis once (so it listens on the
    // slot's channel), and hands the lock over through Redis once (so the script is loaded).
    let theirs = setup.other.lock(name).unwrap().acquire().await.unwrap();
    let warm = spawn_acquire();
    assert!(eventually(SLACK, || setup.queue_length(name) == 1).await);
    theirs.release().await.unwrap();
    let warm = tokio::time::timeout(SLACK, warm)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let kept = spawn_acquire();
    tokio::task::yield_now().await;
    let other_instance = setup.other_waits(name).await;
    warm.release().await.unwrap();
    let theirs = tokio::time::timeout(SLACK, other_instance)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    theirs.release().await.unwrap();
    let first = tokio::time::timeout(SLACK, kept)
        .await
        .unwrap()
        .unwrap()
        .unwrap();

    // Now the hand-over whose reply is cut.
    let owner = first.owner_id().to_owned();
    let next_task = spawn_acquire();
    tokio::task::yield_now().await;
    let other_instance = setup.other_waits(name).await;
    let release = tokio::spawn(first.release());
    let answer = setup
        .cut_after_it_ran(release, || setup.field(&key, &owner).is_none())
        .await;
    assert!(
        answer.is_ok(),
        "the lock was passed on, and says so: {answer:?}"
    );

    // The other instance got it; this client's next task waits behind it, and gets it next.
    let theirs = tokio::time::timeout(SLACK, other_instance)
        .await
        .expect("the other instance gets the lock")
        .unwrap()
        .unwrap();
    assert!(!next_task.is_finished(), "the next task waits its turn");
    let their_token = theirs.fencing_token();
    theirs.release().await.unwrap();
    let ours = tokio::time::timeout(SLACK, next_task)
        .await
        .expect("the next task gets the lock after the other instance")
        .unwrap()
        .unwrap();
    assert!(ours.fencing_token() > their_token);
    ours.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guarded_write_sent_again_is_applied_once() {
    let name = "order-12";
    let events = format!("events:{{{name}}}");
    let setup = ThroughProxy::start(name).await;
    let guard = setup.locks.lock(name).unwrap().acquire().await.unwrap();
    // Once before replies are held back, so the script is loaded.
    let first = GuardedWrites::new().command("RPUSH", &events, ["created"]);
    assert!(guard.write_if_held(&first).await.unwrap());

    let charge = GuardedWrites::new().command("RPUSH", &events, ["charged"]);
    let write = tokio::spawn(async move {
        let applied = guard.write_if_held(&charge).await?;
        Ok((applied, guard))
    });
    let length = || setup.cluster.cmd::<i64>(setup.node, &["LLEN", &events]);
    let answer = setup.cut_after_it_ran(write, || length() == 2).await;
    let (applied, guard) = answer.expect("the write's answer");
    assert!(applied, "the write was applied, and says so");
    let written: Vec<String> = setup
        .cluster
        .cmd(setup.node, &["LRANGE", &events, "0", "-1"]);
    assert_eq!(written, ["created", "charged"], "each write once");
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_unlock_sent_again_leaves_the_lock_to_the_waiter_it_was_granted_to() {
    let name = "order-13";
    let key = format!("lock:{{{name}}}");
    let setup = ThroughProxy::start(name).await;
    let operator = setup.locks.lock(name).unwrap();
    // Once before replies are held back, so the script is loaded.
    assert!(
        !operator.force_unlock().await.unwrap(),
        "nothing to remove yet"
    );
    let held = setup.other.lock(name).unwrap().acquire().await.unwrap();
    let waiter_client = LockClient::builder_cluster(setup.cluster.urls())
        .build()
        .await
        .unwrap();
    let waiter_lock = waiter_client.lock(name).unwrap();
    let waiting = tokio::spawn(async move { waiter_lock.acquire().await });
    assert!(
        eventually(SLACK, || setup.queue_length(name) == 1).await,
        "the waiter waits in Redis"
    );

    let holder = held.owner_id().to_owned();
    let unlock = tokio::spawn(async move { operator.force_unlock().await });
    let removed = setup
        .cut_after_it_ran(unlock, || setup.field(&key, &holder).is_none())
        .await;
    assert!(
        removed.unwrap(),
        "the force-unlock removed the lock, and says so"
    );

    // The lock went to the waiter, and stays its own: it holds the grant the force-unlock
    // made (whose tokens the lock's fence names), not a lock it had to take again after a
    // second run removed that grant.
    let fence: String = setup
        .cluster
        .cmd(setup.node, &["GET", &format!("{key}:fence")]);
    let granted = tokio::time::timeout(SLACK, waiting)
        .await
        .expect("the waiter gets the lock")
        .unwrap()
        .unwrap();
    let grant: Vec<&str> = fence.splitn(3, ' ').collect();
    assert_eq!(
        grant[2],
        granted.owner_id(),
        "granted to the waiter: {fence}"
    );
    assert_eq!(
        grant[1],
        granted.fencing_token().to_string(),
        "the waiter holds the force-unlock's grant: {fence}"
    );
    assert_eq!(
        setup.field(&key, granted.owner_id()).as_deref(),
        Some("1"),
        "the waiter holds the lock in Redis"
    );
    assert!(granted.is_held());
    granted.release().await.unwrap();
    drop(held);
}
