//! A client of one server (`LockClient::connect`, `LockClient::builder(url)`) given the URL of
//! a node of a real Redis Cluster: every operation fails at once with
//! [`ErrorKind::InvalidConfig`] and a message that names `builder_cluster`, whether the key's
//! slot is on that node or another and whether the operation sends a key at all; nothing is
//! written, and no listing shows one node's locks as if they were all.

mod support;

use std::time::{Duration, Instant};

use support::RedisServer;
use support::cluster::RedisCluster;
use tower_redis_lock::{ErrorKind, LockClient, LockError};

/// Generous bound for what should fail at once (shared, busy machines).
const PROMPTLY: Duration = Duration::from_secs(10);

/// The first `tenant-N` whose lock lives on (`on_node`) or off the master on `port`.
fn name_where(cluster: &RedisCluster, port: u16, on_node: bool) -> String {
    (0..)
        .map(|n| format!("tenant-{n}"))
        .find(|name| (cluster.node_of(&format!("lock:{{{name}}}")) == port) == on_node)
        .expect("a name")
}

/// `err` is the typed error of a single-server client of the cluster node at `url`.
fn assert_cluster_node_error(err: &LockError, url: &str, what: &str) {
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{what}: {err}");
    let message = err.to_string();
    assert!(
        message.contains(&format!("{url} is a node of a Redis Cluster")),
        "{what}: {message}"
    );
    assert!(
        message.contains("LockClient::builder_cluster"),
        "{what}: {message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_server_client_of_a_cluster_node_fails_every_operation_naming_builder_cluster() {
    let cluster = RedisCluster::start(3);
    cluster.provision_epochs().await;
    let node = cluster.masters()[0];
    let url = format!("redis://127.0.0.1:{node}");
    let here = name_where(&cluster, node, true);
    let elsewhere = name_where(&cluster, node, false);
    // Locks held on both nodes: a listing of one node would have shown one and hidden the other.
    let cluster_locks = LockClient::builder_cluster(cluster.urls())
        .build()
        .await
        .expect("cluster client");
    let mut held = Vec::new();
    for name in [&here, &elsewhere] {
        held.push(cluster_locks.lock(name).unwrap().acquire().await.unwrap());
    }
    let keys = cluster.keys();

    let locks = LockClient::connect(&url)
        .await
        .expect("built without a round trip");
    for name in [&here, &elsewhere] {
        let started = Instant::now();
        let err = locks
            .lock(&format!("{name}-free"))
            .unwrap()
            .acquire_timeout(PROMPTLY * 6)
            .await
            .expect_err("acquired on a cluster node");
        assert_cluster_node_error(&err, &url, "acquire");
        assert!(
            started.elapsed() < PROMPTLY,
            "not at once but {:?}",
            started.elapsed()
        );
        let err = locks.lock(name).unwrap().try_acquire().await.unwrap_err();
        assert_cluster_node_error(&err, &url, "try_acquire of a held lock");
    }
    let err = locks.list(None, None, 100).await.unwrap_err();
    assert_cluster_node_error(&err, &url, "list");
    let err = locks.inspect(&here).await.unwrap_err();
    assert_cluster_node_error(&err, &url, "inspect");
    let err = locks.waive_restart_quarantine().await.unwrap_err();
    assert_cluster_node_error(&err, &url, "waive_restart_quarantine");
    assert_eq!(cluster.keys(), keys, "nothing was written");

    // A pool of the caller's is checked the same way.
    let pool = deadpool_redis::Config::from_url(url.clone())
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap();
    let pooled = LockClient::builder(&url).pool(pool).build().await.unwrap();
    let err = pooled
        .lock(&elsewhere)
        .unwrap()
        .try_acquire()
        .await
        .unwrap_err();
    assert_cluster_node_error(&err, &url, "acquire on a pool of the caller's");

    for guard in held {
        guard.release().await.unwrap();
    }
    for client in [locks, pooled, cluster_locks] {
        client.shutdown().await;
    }
}

#[tokio::test]
async fn a_builder_tells_a_cluster_node_from_a_lone_server() {
    let cluster = RedisCluster::start(3);
    let server = RedisServer::start();
    for url in cluster.urls() {
        let builder = LockClient::builder(&url);
        assert!(builder.points_to_cluster_node().await.unwrap(), "{url}");
    }
    let lone = LockClient::builder(&server.url());
    assert!(!lone.points_to_cluster_node().await.unwrap());
    // And the lone server's client works as ever.
    let locks = lone.build().await.unwrap();
    locks
        .lock("plain")
        .unwrap()
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let nobody = LockClient::builder(&format!("redis://127.0.0.1:{}", support::free_port()))
        .command_timeout(Duration::from_millis(500));
    let err = nobody.points_to_cluster_node().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RedisUnavailable, "{err}");
}
