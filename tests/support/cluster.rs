//! A real Redis Cluster for tests: three masters (`redis-server --cluster-enabled yes`, each
//! in a directory of its own, on free ports) joined by `redis-cli --cluster create`, killed
//! and removed on drop.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{free_port, server_binary};

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
    dir: PathBuf,
    /// What the node runs with besides the harness's own environment (a fake clock).
    env: Vec<(String, String)>,
}

impl RedisCluster {
    /// Starts `masters` masters with no replicas and waits until every node reports
    /// `cluster_state:ok`.
    pub fn start(masters: usize) -> Self {
        Self::start_with_replicas(masters, 0)
    }

    /// Starts `masters` masters with `replicas` replicas each, and waits until every node
    /// reports `cluster_state:ok` and every replica is in sync.
    pub fn start_with_replicas(masters: usize, replicas: usize) -> Self {
        Self::start_with_env(masters, replicas, |_| Vec::new())
    }

    /// Starts `masters` masters with no replicas, master `n` on the wall clock `clocks[n]`.
    pub fn start_with_clocks(clocks: &[super::clock::FakeClock]) -> Self {
        Self::start_with_env(clocks.len(), 0, |node| clocks[node].env())
    }

    /// Starts the cluster, node `n` (masters first) with the environment `env(n)` added. A
    /// formation that does not end within [`FORM_BOUND`] (`redis-cli --cluster create` waits
    /// for every node to join, forever should one have died meanwhile) is abandoned, its
    /// nodes killed, and the cluster formed again on other ports, up to three times.
    fn start_with_env(
        masters: usize,
        replicas: usize,
        env: impl Fn(usize) -> Vec<(String, String)>,
    ) -> Self {
        let mut failures = Vec::new();
        for _ in 0..3 {
            match Self::form(masters, replicas, &env) {
                Ok(cluster) => return cluster,
                Err(failure) => failures.push(failure),
            }
        }
        panic!("the cluster did not form: {failures:?}");
    }

    /// One attempt of [`Self::start_with_env`]: the nodes, then `redis-cli --cluster create`
    /// within [`FORM_BOUND`]; on failure, why (the nodes are killed when the value drops).
    fn form(
        masters: usize,
        replicas: usize,
        env: &impl Fn(usize) -> Vec<(String, String)>,
    ) -> Result<Self, String> {
        // Random, not a free port: two clusters of one test process could be given the same
        // port, and the first to drop would remove the other's nodes' files with its own.
        let dir = std::env::temp_dir().join(format!(
            "tower-redis-lock-cluster-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::create_dir_all(&dir).expect("cluster directory");
        let mut cluster = Self {
            nodes: Vec::new(),
            dir,
        };
        for index in 0..masters * (1 + replicas) {
            let node = cluster.own_node(env(index));
            cluster.nodes.push(node);
        }
        let addresses: Vec<String> = cluster
            .nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect();
        let mut create = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-cli");
        let started = Instant::now();
        let created = loop {
            if let Some(status) = create.try_wait().expect("redis-cli") {
                break status.success();
            }
            if started.elapsed() > FORM_BOUND {
                let _ = create.kill();
                let _ = create.wait();
                break false;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        if !created {
            let exited: Vec<u16> = cluster
                .nodes
                .iter_mut()
                .filter_map(|node| node.child.try_wait().ok().flatten().map(|_| node.port))
                .collect();
            return Err(format!(
                "redis-cli --cluster create {addresses:?} failed or hung; nodes exited: {exited:?}"
            ));
        }
        let ports = cluster.ports();
        cluster.await_condition("every node sees the cluster ok", || {
            ports.iter().all(|port| {
                cluster
                    .try_cmd::<String>(*port, &["CLUSTER", "INFO"])
                    .is_ok_and(|info| info.contains("cluster_state:ok"))
            })
        });
        if replicas > 0 {
            cluster.await_condition("every replica is in sync", || {
                cluster.masters().iter().all(|master| {
                    cluster
                        .try_cmd::<String>(*master, &["INFO", "replication"])
                        .is_ok_and(|info| info.matches("state=online").count() == replicas)
                })
            });
        }
        Ok(cluster)
    }

    /// The ports of the nodes that are masters now.
    pub fn masters(&self) -> Vec<u16> {
        self.ports()
            .into_iter()
            .filter(|port| {
                self.try_cmd::<Vec<redis::Value>>(*port, &["ROLE"])
                    .is_ok_and(|role| {
                        matches!(role.first(), Some(redis::Value::BulkString(kind)) if kind == b"master")
                    })
            })
            .collect()
    }

    /// The port of a replica of the master on `master_port`.
    pub fn replica_of(&self, master_port: u16) -> u16 {
        let master_id = self.node_id(master_port);
        self.ports()
            .into_iter()
            .find(|port| {
                self.try_cmd::<String>(*port, &["INFO", "replication"])
                    .is_ok_and(|info| {
                        info.contains("role:slave")
                            && info.contains(&format!("master_port:{master_port}"))
                    })
            })
            .unwrap_or_else(|| panic!("master {master_port} ({master_id}) has no replica"))
    }

    /// Makes the replica on `port` take over from its master with `CLUSTER FAILOVER` (planned:
    /// the replica catches up first), trying again up to three times: Redis gives a manual
    /// failover up when it cannot complete in time, as on a busy machine. Whether it took.
    pub async fn planned_failover(&self, replica: u16) -> bool {
        for _ in 0..3 {
            let _: () = self.cmd(replica, &["CLUSTER", "FAILOVER"]);
            let promoted = super::eventually(Duration::from_secs(10), || {
                self.masters().contains(&replica)
            })
            .await;
            if promoted {
                return true;
            }
        }
        false
    }

    /// The node id of the node on `port`.
    pub fn node_id(&self, port: u16) -> String {
        self.cmd(port, &["CLUSTER", "MYID"])
    }

    /// Starts the killed node on `port` again, in its directory: it rejoins the cluster with
    /// its `nodes.conf` but none of its data (no persistence), as a replica of whichever
    /// node took its slots over.
    pub fn restart(&mut self, port: u16) {
        let node = self
            .nodes
            .iter_mut()
            .find(|node| node.port == port)
            .expect("a node of this cluster");
        node.child = spawn_node(port, &node.dir, &node.env);
    }

    /// Waits (polling `INFO server`) until the node on `port` has been up at least `seconds`.
    pub fn wait_until_up_for(&self, port: u16, seconds: u64) {
        loop {
            let info: String = self.cmd(port, &["INFO", "server"]);
            if super::uptime_in_seconds(&info).unwrap_or(0) >= seconds {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Kills the node on `port` at once (SIGKILL).
    pub fn kill(&mut self, port: u16) {
        if let Some(node) = self.nodes.iter_mut().find(|node| node.port == port) {
            let _ = node.child.kill();
            let _ = node.child.wait();
        }
    }

    /// Moves `slot` from the master on `from` to the master on `to`, keys and all, as
    /// `redis-cli --cluster reshard` does: IMPORTING and MIGRATING, MIGRATE of every key,
    /// then the new owner told to every node.
    pub fn migrate_slot(&self, slot: u16, from: u16, to: u16) {
        self.start_migration(slot, from, to, &[]);
        self.finish_migration(slot, from, to);
    }

    /// Starts moving `slot` from the master on `from` to the master on `to`, and stops half
    /// way, as a resharding that died would: IMPORTING and MIGRATING set, and of the slot's
    /// keys only `moved` (those that exist) on the new master.
    pub fn start_migration(&self, slot: u16, from: u16, to: u16, moved: &[&str]) {
        let slot = slot.to_string();
        let (from_id, to_id) = (self.node_id(from), self.node_id(to));
        let _: () = self.cmd(to, &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id]);
        let _: () = self.cmd(from, &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to_id]);
        if !moved.is_empty() {
            let to_port = to.to_string();
            let mut args = vec!["MIGRATE", "127.0.0.1", &to_port, "", "0", "5000", "KEYS"];
            args.extend(moved);
            let _: String = self.cmd(from, &args);
        }
    }

    /// The keys of `slot` on the node on `port` (at most 100).
    pub fn keys_in_slot(&self, port: u16, slot: u16) -> Vec<String> {
        self.cmd(
            port,
            &["CLUSTER", "GETKEYSINSLOT", &slot.to_string(), "100"],
        )
    }

    /// A master other than the one on `port`.
    pub fn other_master(&self, port: u16) -> u16 {
        *self
            .masters()
            .iter()
            .find(|master| **master != port)
            .expect("another master")
    }

    /// Finishes a migration [`Self::start_migration`] began: the rest of the keys, then the
    /// new owner told to every node.
    pub fn finish_migration(&self, slot: u16, from: u16, to: u16) {
        let to_id = self.node_id(to);
        loop {
            let keys = self.keys_in_slot(from, slot);
            if keys.is_empty() {
                break;
            }
            let to_port = to.to_string();
            let mut args = vec!["MIGRATE", "127.0.0.1", &to_port, "", "0", "5000", "KEYS"];
            args.extend(keys.iter().map(String::as_str));
            let _: String = self.cmd(from, &args);
        }
        for port in self.ports() {
            let _ = self.try_cmd::<()>(
                port,
                &["CLUSTER", "SETSLOT", &slot.to_string(), "NODE", &to_id],
            );
        }
    }

    /// The slot of `key`.
    pub fn slot_of(&self, key: &str) -> u16 {
        let slot: i64 = self.cmd(self.live_port(), &["CLUSTER", "KEYSLOT", key]);
        slot as u16
    }

    /// A node that answers.
    fn live_port(&self) -> u16 {
        self.ports()
            .into_iter()
            .find(|port| self.answers(*port))
            .expect("a node that answers")
    }

    /// Whether the node on `port` answers PING.
    pub fn answers(&self, port: u16) -> bool {
        self.try_cmd::<String>(port, &["PING"]).is_ok()
    }

    /// Waits up to `bound` until the node on `port` serves its slots (`cluster_state:ok`), as
    /// a restarted master does once it has met the other masters again.
    pub async fn serving(&self, port: u16, bound: Duration) -> bool {
        super::eventually(bound, || {
            self.try_cmd::<String>(port, &["CLUSTER", "INFO"])
                .is_ok_and(|info| info.contains("cluster_state:ok"))
        })
        .await
    }

    /// A node of this cluster on a free port, answering: a port another test's server took
    /// meanwhile (a race of free ports) makes the new one exit, and the harness takes
    /// another port, so no node of another test ever joins this cluster.
    fn own_node(&self, env: Vec<(String, String)>) -> Node {
        let mut last_error = String::new();
        for _ in 0..10 {
            let port = free_port();
            let dir = self.dir.join(port.to_string());
            std::fs::create_dir_all(&dir).expect("node directory");
            let mut child = spawn_node(port, &dir, &env);
            let info = || {
                // The default sections hold both (see `await_own_process`).
                self.try_cmd::<String>(port, &["INFO"]).ok()
            };
            match super::await_own_process(&mut child, port, FORM_BOUND, info) {
                Ok(()) => {
                    return Node {
                        port,
                        child,
                        dir,
                        env,
                    };
                }
                Err(err) => last_error = err,
            }
            // Exited, someone else's port, or silent past the bound: not this node.
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("no cluster node could start: {last_error}");
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

    /// Gives every slot its epoch with no quarantine, as an operator does on a new cluster
    /// (`lockctl --cluster waive-quarantine`): otherwise each slot's first lock waits one.
    pub async fn provision_epochs(&self) {
        let operator = tower_redis_lock::LockClient::builder_cluster(self.urls())
            .build()
            .await
            .expect("cluster client");
        operator
            .waive_restart_quarantine()
            .await
            .expect("every slot's epoch is written");
        operator.shutdown().await;
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

    /// Runs `args` on the node on `port` after `ASKING`, as a client redirected to a node
    /// that imports the key's slot does.
    pub fn cmd_asking<T: redis::FromRedisValue>(&self, port: u16, args: &[&str]) -> T {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
        let mut conn = client
            .get_connection_with_timeout(Duration::from_secs(2))
            .unwrap();
        let mut pipe = redis::pipe();
        pipe.cmd("ASKING").ignore();
        let command = pipe.cmd(args[0]);
        for arg in &args[1..] {
            command.arg(*arg);
        }
        let (reply,): (T,) = pipe
            .query(&mut conn)
            .unwrap_or_else(|err| panic!("ASKING {args:?} on {port}: {err}"));
        reply
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

    /// The lock keys on `ports` that stay: every `lock:{…` key but the last token blocks
    /// granted (which expire with a grant's lease) and the traces of releases (which expire
    /// after twice the command timeout, see `lua/lib/release_trace.lua`), each only if it
    /// does expire.
    pub fn lock_keys_left(&self, ports: &[u16]) -> Vec<String> {
        let mut left = Vec::new();
        for &port in ports {
            for key in self.cmd::<Vec<String>>(port, &["KEYS", "lock:{*"]) {
                let expiring = key.ends_with(":fence") || key.ends_with(":released");
                // -1: no expiry; -2: gone since KEYS.
                if !expiring || self.cmd::<i64>(port, &["PTTL", &key]) == -1 {
                    left.push(key);
                }
            }
        }
        left
    }

    /// Runs one command on the node at `port`.
    pub fn cmd<T: redis::FromRedisValue>(&self, port: u16, args: &[&str]) -> T {
        self.try_cmd(port, args)
            .unwrap_or_else(|err| panic!("{args:?} on node {port}: {err}"))
    }

    /// The port of the master serving `key`'s slot.
    pub fn node_of(&self, key: &str) -> u16 {
        let slot = i64::from(self.slot_of(key));
        let shards: redis::Value = self.cmd(self.live_port(), &["CLUSTER", "SLOTS"]);
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

    /// How many keys the masters hold together.
    pub fn keys(&self) -> i64 {
        self.masters()
            .iter()
            .map(|port| self.cmd::<i64>(*port, &["DBSIZE"]))
            .sum()
    }
}

/// A cluster node on `port`, in `dir` (its `nodes.conf` lives there), with `env` added.
fn spawn_node(port: u16, dir: &std::path::Path, env: &[(String, String)]) -> Child {
    let binary = server_binary();
    Command::new(&binary)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args([
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
        ])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .current_dir(dir)
        .envs(env.iter().map(|(name, value)| (name, value)))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|err| {
            panic!("{binary} could not start ({err}); run ./scripts/setup.sh to install it")
        })
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
