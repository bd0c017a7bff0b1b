//! The idempotent route of the axum example (`POST /payments`) as the tests drive it: its
//! instances as processes, a payment sent over real HTTP, and what the handler left in
//! Redis (its runs and its charges per key, under the tag of the key's record).

use std::future::Future;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use tower_redis_lock::idempotency::{IdempotencyRecords, REPLAYED_HEADER};

use super::cluster::RedisCluster;
use super::{ChildGuard, RedisServer, axum_instance, axum_instance_on};

/// Bound for what normally takes milliseconds to a few seconds; generous because CI
/// machines are shared.
pub const SLACK: Duration = Duration::from_secs(20);

/// One instance of the example, killed on drop.
pub struct Instance {
    pub url: String,
    pub process: ChildGuard,
}

impl Instance {
    /// Starts `name` on a free port with extra arguments, and waits for its listening line.
    pub fn start(server: &RedisServer, name: &str, extra: &[&str]) -> Self {
        let (url, process) = axum_instance(server, name, extra);
        Self { url, process }
    }

    /// Starts `name` on `cluster`, as [`Instance::start`] does on one server.
    pub fn start_on_cluster(cluster: &RedisCluster, name: &str, extra: &[&str]) -> Self {
        let mut redis = vec!["--cluster".to_owned()];
        for url in cluster.urls() {
            redis.extend(["--redis".to_owned(), url]);
        }
        let (url, process) = axum_instance_on(&redis, name, extra);
        Self { url, process }
    }

    /// Sends the process `signal` (`-STOP`, `-CONT`) by its id.
    pub fn signal(&self, signal: &str) {
        signal_pid(self.process.0.id(), signal);
    }

    /// Kills the process at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        self.process.0.kill().expect("the instance is killed");
        self.process.0.wait().expect("the instance is reaped");
    }
}

/// Sends `signal` to the process `pid`.
pub fn signal_pid(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill {signal} {pid}");
}

/// What a request got.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub status: u16,
    pub replayed: bool,
    pub retry_after: Option<String>,
    pub body: Bytes,
}

impl Answer {
    /// The body as JSON (a payment).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|err| panic!("no JSON ({err}): {:?}", self.body))
    }
}

/// A payment's body.
pub fn payment(amount: u64) -> String {
    format!("{{\"amount\":{amount},\"currency\":\"EUR\"}}")
}

/// How the handler is asked to take its time: `work_ms` before its charge, and
/// `after_charge_ms` after it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Timing {
    pub work_ms: u64,
    pub after_charge_ms: u64,
}

impl Timing {
    /// Work before the charge only.
    pub fn work(work_ms: u64) -> Self {
        Self {
            work_ms,
            after_charge_ms: 0,
        }
    }
}

/// Posts a payment of `tenant` with idempotency `key` to `target`, with the handler's
/// `timing`, giving up after `patience`. An error when no answer came (an instance killed,
/// or the client gave up).
pub async fn pay_within(
    target: &str,
    tenant: &str,
    key: &str,
    body: &str,
    timing: Timing,
    patience: Duration,
) -> Result<Answer, String> {
    let http = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let request = hyper::Request::post(format!("{target}/payments"))
        .header("x-tenant-id", tenant)
        .header("idempotency-key", key)
        .header("x-work-ms", timing.work_ms.to_string())
        .header("x-after-charge-ms", timing.after_charge_ms.to_string())
        .body(Full::new(Bytes::from(body.to_owned())))
        .expect("a request");
    let answer = async {
        let response = http.request(request).await.map_err(|err| err.to_string())?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await.map_err(|err| err.to_string())?;
        let header = |name: &str| {
            let value = parts.headers.get(name)?;
            Some(value.to_str().expect("ASCII").to_owned())
        };
        Ok(Answer {
            status: parts.status.as_u16(),
            replayed: header(REPLAYED_HEADER).is_some_and(|value| value == "true"),
            retry_after: header("retry-after"),
            body: body.to_bytes(),
        })
    };
    tokio::time::timeout(patience, answer)
        .await
        .map_err(|_| format!("no answer from {target} within {patience:?}"))?
}

/// `pay_within` a patience that panics when it runs out.
pub async fn pay(
    target: &str,
    tenant: &str,
    key: &str,
    body: &str,
    timing: Timing,
) -> Result<Answer, String> {
    let answer = pay_within(target, tenant, key, body, timing, SLACK * 3).await;
    if let Err(err) = &answer {
        assert!(!err.starts_with("no answer"), "{err}");
    }
    answer
}

/// `pay` that must get an answer.
pub async fn paid(target: &str, tenant: &str, key: &str, body: &str, timing: Timing) -> Answer {
    pay(target, tenant, key, body, timing)
        .await
        .unwrap_or_else(|err| panic!("{target} did not answer: {err}"))
}

/// The handler's counters in Redis, per key of a tenant.
pub struct Counters<'a> {
    pub store: Store<'a>,
    pub records: &'a IdempotencyRecords,
    /// The SQLite ledger of instances started with `--payments-sql`: their charges.
    pub ledger: Option<PathBuf>,
}

/// Where the handler's counters are: one server, or a cluster.
#[derive(Clone, Copy)]
pub enum Store<'a> {
    Server(&'a RedisServer),
    Cluster(&'a RedisCluster),
}

impl<'a> Counters<'a> {
    /// The counters on one server.
    pub fn on(server: &'a RedisServer, records: &'a IdempotencyRecords) -> Self {
        Self {
            store: Store::Server(server),
            records,
            ledger: None,
        }
    }

    fn read(&self, what: &str, tenant: &str, key: &str) -> u64 {
        let tag = self.records.hash_tag(&[tenant.to_owned()], key).unwrap();
        let counter = format!("payments:{what}:{tag}");
        let count: Option<u64> = match self.store {
            Store::Server(server) => server.cmd(&["GET", &counter]),
            Store::Cluster(cluster) => cluster.cmd(cluster.node_of(&counter), &["GET", &counter]),
        };
        count.unwrap_or(0)
    }

    /// How often the handler started for `key` of `tenant` (answers from an earlier
    /// attempt's committed outcome not counted).
    pub fn runs(&self, tenant: &str, key: &str) -> u64 {
        self.read("runs", tenant, key)
    }

    /// How often `key` of `tenant` was charged: more than 1 is a double charge.
    pub fn charges(&self, tenant: &str, key: &str) -> u64 {
        let Some(ledger) = &self.ledger else {
            return self.read("charges", tenant, key);
        };
        let Ok(ledger) = rusqlite::Connection::open(ledger) else {
            return 0;
        };
        let count = "SELECT COUNT(*) FROM ledger WHERE tenant = ?1 AND payment_key = ?2";
        // No table yet (no instance made it) is no charge.
        let rows: i64 = ledger
            .query_row(count, [tenant, key], |row| row.get(0))
            .unwrap_or(0);
        rows.try_into().expect("a count")
    }

    /// Waits (polling Redis) until the handler started `runs` times for `key`.
    pub async fn until_runs(&self, tenant: &str, key: &str, runs: u64) {
        let ran = super::eventually(SLACK, || self.runs(tenant, key) >= runs).await;
        assert!(
            ran,
            "the handler did not start run {runs} of {key} within {SLACK:?}"
        );
        assert_eq!(self.runs(tenant, key), runs, "runs of {key}");
    }

    /// Waits (polling Redis) until `key` was charged once.
    pub async fn until_charged(&self, tenant: &str, key: &str) {
        let charged = super::eventually(SLACK, || self.charges(tenant, key) >= 1).await;
        assert!(charged, "{key} was not charged within {SLACK:?}");
    }
}

/// Every key's charge count on `server`, read apart from any load generator.
pub fn every_charge(server: &RedisServer) -> Vec<u64> {
    let counters: Vec<String> = server.cmd(&["KEYS", "payments:charges:*"]);
    if counters.is_empty() {
        return Vec::new();
    }
    let mut mget = vec!["MGET"];
    mget.extend(counters.iter().map(String::as_str));
    server.cmd(&mget)
}

/// Polls `condition` every 20 ms until it holds; panics with `what` past `bound`.
pub async fn until<F, Fut>(bound: Duration, what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = Instant::now();
    while !condition().await {
        assert!(started.elapsed() < bound, "not within {bound:?}: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Asserts that every answer in `duplicates` is `stored`, replayed, byte for byte.
pub fn assert_replays(stored: &Answer, duplicates: &[Answer]) {
    for duplicate in duplicates {
        assert!(duplicate.replayed, "not a replay: {duplicate:?}");
        assert_eq!(
            (duplicate.status, &duplicate.body),
            (stored.status, &stored.body),
            "a duplicate got another answer"
        );
    }
}
