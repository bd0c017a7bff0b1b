//! A real Redis Cluster for tests: three masters (`redis-server --cluster-enabled yes`, each
//! in a directory of its own, on free ports) joined by `redis-cli --cluster create`, killed
//! and removed on drop.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::free_port;

/// How long the cluster may take to form and agree (generous: shared, busy machines).
const FORM_BOUND: Duration = Duration::from_secs(60);

/// The nodes of a cluster the test owns.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<Node>,
    dir: PathBuf,
}

#[derive(Debug)]
struct Node {
    port: u16,
    child: Child,
}

impl RedisCluster {
    /// Starts `masters` masters with no replicas and waits until every node reports
    /// `cluster_state:ok`.
    pub fn start(masters: usize) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "tower-redis-lock-cluster-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).expect("cluster directory");
        let mut cluster = Self {
            nodes: Vec::new(),
            dir,
        };
        for _ in 0..masters {
            let port = free_port();
            let node_dir = cluster.dir.join(port.to_string());
            std::fs::create_dir_all(&node_dir).expect("node directory");
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args([
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                ])
                .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                .current_dir(&node_dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server could not start; run ./scripts/setup.sh to install it");
            cluster.nodes.push(Node { port, child });
        }
        for node in &cluster.nodes {
            cluster.await_condition(&format!("node {} answers", node.port), || {
                cluster.try_cmd::<String>(node.port, &["PING"]).is_ok()
            });
        }
        let addresses: Vec<String> = cluster
            .nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect();
        let created = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli");
        assert!(created.success(), "redis-cli --cluster create failed");
        let ports = cluster.ports();
        cluster.await_condition("every node sees the cluster ok", || {
            ports.iter().all(|port| {
                cluster
                    .try_cmd::<String>(*port, &["CLUSTER", "INFO"])
                    .is_ok_and(|info| info.contains("cluster_state:ok"))
            })
        });
        cluster
    }

    fn await_condition(&self, what: &str, mut condition: impl FnMut() -> bool) {
        let started = Instant::now();
        while !condition() {
            assert!(
                started.elapsed() < FORM_BOUND,
                "{what}: not within {FORM_BOUND:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The nodes' ports.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|node| node.port).collect()
    }

    /// The nodes' URLs, the seeds of a cluster client.
    pub fn urls(&self) -> Vec<String> {
        self.ports()
            .iter()
            .map(|port| format!("redis://127.0.0.1:{port}"))
            .collect()
    }

    fn try_cmd<T: redis::FromRedisValue>(&self, port: u16, args: &[&str]) -> redis::RedisResult<T> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
        let mut conn = client.get_connection_with_timeout(Duration::from_secs(2))?;
        let mut command = redis::cmd(args[0]);
        for arg in &args[1..] {
            command.arg(*arg);
        }
        command.query(&mut conn)
    }

    /// Runs one command on the node at `port`.
    pub fn cmd<T: redis::FromRedisValue>(&self, port: u16, args: &[&str]) -> T {
        self.try_cmd(port, args)
            .unwrap_or_else(|err| panic!("{args:?} on node {port}: {err}"))
    }

    /// The port of the master serving `key`'s slot.
    pub fn node_of(&self, key: &str) -> u16 {
        let slot: i64 = self.cmd(self.nodes[0].port, &["CLUSTER", "KEYSLOT", key]);
        let shards: redis::Value = self.cmd(self.nodes[0].port, &["CLUSTER", "SLOTS"]);
        let redis::Value::Array(ranges) = shards else {
            panic!("CLUSTER SLOTS: {shards:?}");
        };
        for range in ranges {
            let redis::Value::Array(fields) = range else {
                continue;
            };
            let (Some(redis::Value::Int(start)), Some(redis::Value::Int(end))) =
                (fields.first(), fields.get(1))
            else {
                continue;
            };
            if (*start..=*end).contains(&slot)
                && let Some(redis::Value::Array(master)) = fields.get(2)
                && let Some(redis::Value::Int(port)) = master.get(1)
            {
                return *port as u16;
            }
        }
        panic!("no node serves slot {slot}");
    }

    /// How many times the node at `port` ran `command` since its last `CONFIG RESETSTAT`
    /// (inside scripts included).
    pub fn command_calls(&self, port: u16, command: &str) -> u64 {
        let stats: String = self.cmd(port, &["INFO", "commandstats"]);
        let prefix = format!("cmdstat_{command}:calls=");
        stats
            .lines()
            .find_map(|line| line.strip_prefix(prefix.as_str()))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |calls| calls.parse().expect("a count"))
    }

    /// How many keys every node holds together.
    pub fn keys(&self) -> i64 {
        self.ports()
            .iter()
            .map(|port| self.cmd::<i64>(*port, &["DBSIZE"]))
            .sum()
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            let _ = node.child.kill();
            let _ = node.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
