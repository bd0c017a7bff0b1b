//! Redis Sentinels for tests: `redis-server sentinel.conf --sentinel`, each with its own
//! config file in a directory of its own (sentinels rewrite it), on free ports, killed and
//! removed on drop.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{free_port, server_binary};

/// How long the sentinels may take to find each other and the replicas (generous: they
/// exchange hellos every 2 s, on shared, busy machines).
const MEET_BOUND: Duration = Duration::from_secs(60);

/// Sentinels watching one master, named [`Sentinels::MASTER`].
#[derive(Debug)]
pub struct Sentinels {
    nodes: Vec<(u16, Child)>,
    dir: PathBuf,
}

impl Sentinels {
    /// The name the sentinels monitor the master by.
    pub const MASTER: &'static str = "locks";

    /// Starts `count` sentinels monitoring the master on `master_port` with a quorum of a
    /// majority, which declare it down after `down_after`, and waits until each knows the
    /// others and `replicas` replicas. A sentinel that led a failover starts none again for
    /// twice `failover_timeout`.
    pub fn start(
        count: usize,
        master_port: u16,
        replicas: usize,
        down_after: Duration,
        failover_timeout: Duration,
    ) -> Self {
        // Random, not a free port, as for a cluster (see `cluster.rs`).
        let dir = std::env::temp_dir().join(format!(
            "tower-redis-lock-sentinels-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::create_dir_all(&dir).expect("sentinel directory");
        let mut sentinels = Self {
            nodes: Vec::new(),
            dir,
        };
        let quorum = count / 2 + 1;
        for _ in 0..count {
            let port = free_port();
            let config = sentinels.dir.join(format!("sentinel-{port}.conf"));
            let text = format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                 sentinel monitor {master} 127.0.0.1 {master_port} {quorum}\n\
                 sentinel down-after-milliseconds {master} {down}\n\
                 sentinel failover-timeout {master} {failover}\n\
                 sentinel parallel-syncs {master} 1\n",
                dir = sentinels.dir.display(),
                master = Self::MASTER,
                down = down_after.as_millis(),
                failover = failover_timeout.as_millis(),
            );
            std::fs::write(&config, text).expect("sentinel config");
            let binary = server_binary();
            let child = Command::new(&binary)
                .arg(&config)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|err| {
                    panic!("{binary} could not start ({err}); run ./scripts/setup.sh to install it")
                });
            sentinels.nodes.push((port, child));
        }
        let started = Instant::now();
        for port in sentinels.ports() {
            loop {
                let known = sentinels.try_count(port, "SENTINELS").unwrap_or(0);
                let replicas_known = sentinels.try_count(port, "REPLICAS").unwrap_or(0);
                if known + 1 >= count && replicas_known >= replicas {
                    break;
                }
                assert!(
                    started.elapsed() < MEET_BOUND,
                    "sentinel {port} knows {known} sentinels and {replicas_known} replicas \
                     after {MEET_BOUND:?}"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        sentinels
    }

    fn try_count(&self, port: u16, what: &str) -> redis::RedisResult<usize> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
        let mut conn = client.get_connection_with_timeout(Duration::from_secs(2))?;
        let listed: Vec<redis::Value> = redis::cmd("SENTINEL")
            .arg(what)
            .arg(Self::MASTER)
            .query(&mut conn)?;
        Ok(listed.len())
    }

    /// The sentinels' ports.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|(port, _)| *port).collect()
    }

    /// The sentinels' URLs.
    pub fn urls(&self) -> Vec<String> {
        self.ports()
            .iter()
            .map(|port| format!("redis://127.0.0.1:{port}"))
            .collect()
    }

    /// The port of the master every sentinel names now, if they agree.
    pub fn master_port(&self) -> Option<u16> {
        let named: Vec<Option<u16>> = self.ports().into_iter().map(Self::named_by).collect();
        let first = *named.first()?;
        named.iter().all(|port| *port == first).then_some(first)?
    }

    /// The port of the master the sentinel on `port` names.
    fn named_by(port: u16) -> Option<u16> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
        let mut conn = client
            .get_connection_with_timeout(Duration::from_secs(2))
            .ok()?;
        let (_, master): (String, String) = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(Self::MASTER)
            .query(&mut conn)
            .ok()?;
        master.parse().ok()
    }
}

impl Drop for Sentinels {
    fn drop(&mut self) {
        for (_, child) in &mut self.nodes {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
