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

/// What every sentinel of a set is told.
struct Settings {
    master_port: u16,
    quorum: usize,
    down_after: Duration,
    failover_timeout: Duration,
}

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
        let settings = Settings {
            master_port,
            quorum: count / 2 + 1,
            down_after,
            failover_timeout,
        };
        for _ in 0..count {
            let sentinel = sentinels.own_sentinel(&settings);
            sentinels.nodes.push(sentinel);
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
                     after {MEET_BOUND:?}; {}",
                    sentinels.describe()
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        sentinels
    }

    /// A sentinel on a free port, answering as its own process: a port another test's server
    /// took meanwhile (a race of free ports) makes the new one exit, and the harness takes
    /// another port, so every sentinel of the set runs.
    fn own_sentinel(&self, settings: &Settings) -> (u16, Child) {
        let binary = server_binary();
        let mut last_error = String::new();
        for _ in 0..10 {
            let port = free_port();
            let mut child = Command::new(&binary)
                .arg(self.write_config(port, settings))
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|err| {
                    panic!("{binary} could not start ({err}); run ./scripts/setup.sh to install it")
                });
            let info = || self.try_info(port).ok();
            match super::await_own_process(&mut child, port, MEET_BOUND, info) {
                Ok(()) => return (port, child),
                Err(err) => last_error = err,
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("a sentinel could not start: {last_error}");
    }

    /// Writes the config of the sentinel on `port` (its own file: sentinels rewrite it), with
    /// a log file next to it for [`Self::describe`].
    fn write_config(&self, port: u16, settings: &Settings) -> PathBuf {
        let config = self.dir.join(format!("sentinel-{port}.conf"));
        let text = format!(
            "port {port}\nbind 127.0.0.1\ndir {dir}\nlogfile {log}\n\
             sentinel monitor {master} 127.0.0.1 {master_port} {quorum}\n\
             sentinel down-after-milliseconds {master} {down}\n\
             sentinel failover-timeout {master} {failover}\n\
             sentinel parallel-syncs {master} 1\n",
            dir = self.dir.display(),
            log = log_path(&self.dir, port).display(),
            master = Self::MASTER,
            master_port = settings.master_port,
            quorum = settings.quorum,
            down = settings.down_after.as_millis(),
            failover = settings.failover_timeout.as_millis(),
        );
        std::fs::write(&config, text).expect("sentinel config");
        config
    }

    /// Whether each sentinel still runs, and the end of its log: what a failure to meet
    /// reports.
    fn describe(&mut self) -> String {
        let dir = self.dir.clone();
        self.nodes
            .iter_mut()
            .map(|(port, child)| {
                let state = match child.try_wait() {
                    Ok(Some(status)) => format!("exited with {status}"),
                    _ => "running".to_owned(),
                };
                let log = std::fs::read_to_string(log_path(&dir, *port)).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(12).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                format!(
                    "sentinel {port} {state}, its log ends:\n{}",
                    tail.join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn try_info(&self, port: u16) -> redis::RedisResult<String> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
        let mut conn = client.get_connection_with_timeout(Duration::from_millis(200))?;
        redis::cmd("INFO").arg("server").query(&mut conn)
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

/// Where the sentinel on `port` logs.
fn log_path(dir: &std::path::Path, port: u16) -> PathBuf {
    dir.join(format!("sentinel-{port}.log"))
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
