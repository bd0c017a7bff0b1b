//! Load generator and checker for the idempotency demo (`./scripts/demo.sh --idempotent`).
//!
//! Sends `POST /payments` to several instances of the `axum_tenants` example: `--keys`
//! idempotency keys, each sent `--copies` times at once, its copies spread round-robin over
//! the instances (copy `j` of key `i` to instance `(i + j) mod n`), with a tenant header.
//! Then checks, per key: that the payment was charged exactly once (its charge counter in
//! Redis, `payments:charges:<tag of the key's record>`), that every copy got the same status and
//! the same body byte for byte, and that all but one carry `idempotent-replayed: true`;
//! 409s (a duplicate that waited past the layer's bound for the first) are counted apart,
//! and fail the run too: with the default 10 s wait there should be none. Last, the first
//! key is sent to every instance with another body, which each must answer 422.
//!
//! `--pause-pids PID,PID,.. --pauses N` pauses the instances in turn during the load, N times
//! (SIGSTOP for `--pause-ms`, 1,500 by default, then SIGCONT), 500 ms after the load starts
//! and 500 ms apart: run the instances with a watchdog lease under the pause, and each pause
//! makes their handlers lose their leases mid-payment. A copy answered 503 is sent again
//! (up to 5 times, 200 ms apart), as a client retries; with pauses, two copies of a key may
//! say they ran (the paused one and the one that took over, which answered the same
//! payment), so only the charges and the answers' equality are checked then.
//!
//! Prints a short report and, last, one JSON line. Exits 1 if a check failed or a request
//! did (no answer, or an answer other than the payment's 201, a replay or a 409).
//!
//! ```text
//! idemgen --redis URL --targets http://127.0.0.1:3000,http://127.0.0.1:3001 \
//!         [--keys 1000] [--copies 5] [--tenants 10] [--concurrency 32] [--work-ms 10] \
//!         [--run <prefix of the keys; random by default>]
//! ```
//!
//! On a Redis Cluster, pass `--cluster` and one `--redis` per seed node.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::future::join_all;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::json;
use tower_redis_lock::LockClient;
use tower_redis_lock::idempotency::IdempotencyRecords;

type Http = Client<HttpConnector, Full<Bytes>>;

/// The header a replayed response carries.
const REPLAYED: &str = "idempotent-replayed";

struct Settings {
    /// The server, or the cluster's seed nodes.
    redis: Vec<String>,
    cluster: bool,
    targets: Vec<String>,
    keys: usize,
    copies: usize,
    tenants: usize,
    concurrency: usize,
    work_ms: u64,
    run: String,
    /// The instances' process ids, `--pauses` times paused for `--pause-ms` in turn.
    pause_pids: Vec<u32>,
    pauses: usize,
    pause_ms: u64,
}

/// One payment: its tenant, its idempotency key and its body.
struct Payment {
    tenant: String,
    key: String,
    body: String,
}

impl Payment {
    fn new(settings: &Settings, i: usize) -> Self {
        Self {
            tenant: format!("t{}", i % settings.tenants),
            key: format!("{}-{i}", settings.run),
            body: json!({"amount": 100 + i, "currency": "EUR"}).to_string(),
        }
    }
}

/// What one copy got: its status, whether it says it was replayed, its body, and how long
/// it took; or why it got nothing.
#[derive(Debug)]
struct Answer {
    status: u16,
    replayed: bool,
    body: Bytes,
    latency_us: u64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let settings = Arc::new(parse()?);
    let http: Http = Client::builder(TokioExecutor::new()).build_http();

    let started = Instant::now();
    let pausing = tokio::spawn(pause_instances(settings.clone()));
    let answers = send_all(&http, &settings).await;
    let elapsed = started.elapsed();
    LOADED.store(true, Ordering::SeqCst);
    // Waits for a pause under way to end: an instance is never left stopped.
    let paused = pausing.await.expect("the pauses");
    let executions = executions(&settings).await?;
    let reused = reuse_first_key(&http, &settings).await;

    let mut report = Report {
        replays_checked: settings.pauses == 0,
        ..Report::default()
    };
    for (i, (copies, executed)) in answers.iter().zip(&executions).enumerate() {
        report.add(i, copies, *executed);
    }
    let expected_replays = settings.keys * (settings.copies - 1);
    let mut latencies: Vec<u64> = answers
        .iter()
        .flatten()
        .filter_map(|copy| copy.as_ref().ok().map(|answer| answer.latency_us))
        .collect();
    latencies.sort_unstable();
    let ms = |us: u64| (us as f64 / 100.0).round() / 10.0;
    let requests = settings.keys * settings.copies;

    println!("idempotent payments demo");
    println!("  instances               {}", settings.targets.len());
    println!(
        "  requests                {requests} ({} keys x {} copies at once, {} failed) in {:.2} s",
        settings.keys,
        settings.copies,
        report.failed,
        elapsed.as_secs_f64()
    );
    println!(
        "  charges per key         once {}, more {}, never {}",
        report.once, report.more, report.never
    );
    println!("  copies that differ      {} keys", report.differing);
    println!(
        "  replayed copies         {} of {expected_replays} ({} keys with another count)",
        report.replayed, report.replays_wrong
    );
    println!("  409 (waited too long)   {}", report.in_progress);
    println!("  instances paused        {paused} times past their lease, mid-load");
    println!(
        "  key reused, other body  422 from {} of {} instances",
        reused,
        settings.targets.len()
    );
    println!(
        "  latency p50 / p99       {} / {} ms",
        ms(percentile(&latencies, 50)),
        ms(percentile(&latencies, 99))
    );
    println!(
        "{}",
        json!({
            "keys": settings.keys,
            "copies": settings.copies,
            "requests": requests,
            "instances": settings.targets.len(),
            "redis": if settings.cluster { "cluster" } else { "server" },
            "redis_nodes": settings.redis.len(),
            "tenants": settings.tenants,
            "executed_once": report.once,
            "executed_more": report.more,
            "paused": paused,
            "never_executed": report.never,
            "differing_keys": report.differing,
            "replayed": report.replayed,
            "replays_wrong": report.replays_wrong,
            "in_progress_409": report.in_progress,
            "failed": report.failed,
            "reused_key_422": reused,
            "p50_ms": ms(percentile(&latencies, 50)),
            "p99_ms": ms(percentile(&latencies, 99)),
        })
    );
    let passed = report.once == settings.keys
        && report.differing + report.replays_wrong + report.in_progress + report.failed == 0
        && reused == settings.targets.len();
    if !passed {
        std::process::exit(1);
    }
    Ok(())
}

/// Sends every key's copies, `concurrency` keys at a time; per key, what each copy got.
async fn send_all(http: &Http, settings: &Arc<Settings>) -> Vec<Vec<Result<Answer, String>>> {
    let next = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..settings.concurrency)
        .map(|_| {
            let (http, settings, next) = (http.clone(), settings.clone(), next.clone());
            tokio::spawn(async move {
                let mut done = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= settings.keys {
                        break;
                    }
                    let payment = Payment::new(&settings, i);
                    let copies = (0..settings.copies).map(|j| {
                        let target = &settings.targets[(i + j) % settings.targets.len()];
                        let body = payment.body.clone();
                        post(&http, target, &payment, body, settings.work_ms)
                    });
                    done.push((i, join_all(copies).await));
                }
                done
            })
        })
        .collect();
    let mut answers: Vec<Vec<Result<Answer, String>>> =
        (0..settings.keys).map(|_| Vec::new()).collect();
    for worker in workers {
        for (i, copies) in worker.await.expect("a worker") {
            answers[i] = copies;
        }
    }
    answers
}

/// Set when the load is sent: no pause starts after it.
static LOADED: AtomicBool = AtomicBool::new(false);

/// Pauses the instances in turn, `pauses` times or until the load is sent: each pause
/// stops one for `pause_ms`; returns how many were made.
async fn pause_instances(settings: Arc<Settings>) -> usize {
    let mut paused = 0;
    for i in 0..settings.pauses {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if LOADED.load(Ordering::SeqCst) {
            break;
        }
        let pid = settings.pause_pids[i % settings.pause_pids.len()].to_string();
        let pause = Duration::from_millis(settings.pause_ms);
        let stopped = tokio::task::spawn_blocking(move || {
            let signal = |name: &str| {
                std::process::Command::new("kill")
                    .args([name, &pid])
                    .status()
                    .is_ok_and(|status| status.success())
            };
            let stopped = signal("-STOP");
            std::thread::sleep(pause);
            signal("-CONT") && stopped
        });
        if stopped.await.unwrap_or(false) {
            paused += 1;
        }
    }
    paused
}

/// Sends one copy of `payment` with `body` to `target`, again while it is answered 503 (an
/// instance paused past its lease tells its client to retry), as a client would.
async fn post(
    http: &Http,
    target: &str,
    payment: &Payment,
    body: String,
    work_ms: u64,
) -> Result<Answer, String> {
    let mut tries = 0;
    loop {
        let answer = post_once(http, target, payment, body.clone(), work_ms).await;
        tries += 1;
        match answer {
            Ok(answer) if answer.status == 503 && tries < 5 => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            answer => return answer,
        }
    }
}

/// Sends one copy of `payment` with `body` to `target`, once.
async fn post_once(
    http: &Http,
    target: &str,
    payment: &Payment,
    body: String,
    work_ms: u64,
) -> Result<Answer, String> {
    let request = hyper::Request::post(format!("{target}/payments"))
        .header("x-tenant-id", &payment.tenant)
        .header("idempotency-key", &payment.key)
        .header("x-work-ms", work_ms.to_string())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|err| err.to_string())?;
    let sent = Instant::now();
    // Far past the layer's 10 s wait bound: a request with no answer by then is stuck.
    let response = tokio::time::timeout(Duration::from_secs(30), async {
        let response = http.request(request).await.map_err(|err| err.to_string())?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await.map_err(|err| err.to_string())?;
        Ok::<_, String>((parts, body.to_bytes()))
    })
    .await
    .map_err(|_| "no answer within 30 s".to_owned())??;
    let (parts, body) = response;
    Ok(Answer {
        status: parts.status.as_u16(),
        replayed: parts.headers.get(REPLAYED).is_some_and(|v| v == "true"),
        body,
        latency_us: sent.elapsed().as_micros() as u64,
    })
}

/// Each key's charge counter, as the handler left it in Redis (0 when it never charged):
/// `payments:charges:<tag>`, with the tag of the key's record.
async fn executions(settings: &Settings) -> Result<Vec<u64>, Box<dyn std::error::Error>> {
    let locks = if settings.cluster {
        LockClient::builder_cluster(&settings.redis).build().await?
    } else {
        LockClient::connect(&settings.redis[0]).await?
    };
    let records = IdempotencyRecords::new(locks.clone(), "");
    let mut counters = Vec::with_capacity(settings.keys);
    for i in 0..settings.keys {
        let payment = Payment::new(settings, i);
        let tag = records.hash_tag(&[payment.tenant], &payment.key)?;
        counters.push(format!("payments:charges:{tag}"));
    }
    locks.shutdown().await;
    async fn read<C: redis::aio::ConnectionLike + Clone>(
        conn: C,
        counters: &[String],
    ) -> Result<Vec<u64>, redis::RedisError> {
        let reads = counters.iter().map(|counter| {
            let mut conn = conn.clone();
            async move {
                let count: Option<u64> = redis::cmd("GET")
                    .arg(counter)
                    .query_async(&mut conn)
                    .await?;
                Ok::<_, redis::RedisError>(count.unwrap_or(0))
            }
        });
        // In order, 64 at a time: one pipelined connection carries them.
        futures_util::stream::iter(reads)
            .buffered(64)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect()
    }
    if settings.cluster {
        let conn = redis::cluster::ClusterClient::new(settings.redis.clone())?
            .get_async_connection()
            .await?;
        Ok(read(conn, &counters).await?)
    } else {
        let conn = redis::Client::open(settings.redis[0].as_str())?
            .get_multiplexed_async_connection()
            .await?;
        Ok(read(conn, &counters).await?)
    }
}

/// Sends the first key with another body to every instance: how many answered 422.
async fn reuse_first_key(http: &Http, settings: &Settings) -> usize {
    let payment = Payment::new(settings, 0);
    let other = json!({"amount": 1, "currency": "XXX"}).to_string();
    let mut refused = 0;
    for target in &settings.targets {
        match post(http, target, &payment, other.clone(), 0).await {
            Ok(answer) if answer.status == 422 => refused += 1,
            outcome => eprintln!("key {} reused at {target}: {outcome:?}", payment.key),
        }
    }
    refused
}

/// The checks, summed over the keys.
#[derive(Debug, Default)]
struct Report {
    /// Keys whose handler ran once, more than once, never.
    once: usize,
    more: usize,
    never: usize,
    /// Keys whose copies (409s aside) did not all get the same status and body.
    differing: usize,
    /// Copies that carry the replay header, and keys where that is not all copies but one.
    replayed: usize,
    replays_wrong: usize,
    /// Copies answered 409.
    in_progress: usize,
    /// Copies with no answer, or an answer that is neither the payment's 201, a replay of it,
    /// nor 409.
    failed: usize,
    /// What went wrong, told on stderr for the first few keys.
    told: usize,
    /// Whether all copies but one must say they were replayed (not with pauses).
    replays_checked: bool,
}

/// How many failed checks are told one by one.
const TOLD: usize = 10;

impl Report {
    fn tell(&mut self, what: String) {
        self.told += 1;
        if self.told <= TOLD {
            eprintln!("{what}");
        } else if self.told == TOLD + 1 {
            eprintln!("(more failed checks not told one by one)");
        }
    }

    fn add(&mut self, i: usize, copies: &[Result<Answer, String>], executed: u64) {
        match executed {
            0 => self.never += 1,
            1 => self.once += 1,
            _ => {
                self.more += 1;
                self.tell(format!("key {i}: the handler ran {executed} times"));
            }
        }
        let mut answered: Vec<&Answer> = Vec::new();
        for copy in copies {
            match copy {
                Ok(answer) if answer.status == 409 => self.in_progress += 1,
                Ok(answer) if answer.status == 201 => answered.push(answer),
                outcome => {
                    self.tell(format!("key {i}: {outcome:?}"));
                    self.failed += 1;
                }
            }
        }
        let mut distinct: BTreeMap<(u16, &[u8]), usize> = BTreeMap::new();
        for answer in &answered {
            *distinct.entry((answer.status, &answer.body)).or_default() += 1;
        }
        if distinct.len() > 1 {
            eprintln!(
                "key {i}: the copies got {} different answers",
                distinct.len()
            );
            self.differing += 1;
        }
        let replayed = answered.iter().filter(|answer| answer.replayed).count();
        self.replayed += replayed;
        // Of the copies answered, all but the one that ran say they were replayed.
        if self.replays_checked && !answered.is_empty() && replayed != answered.len() - 1 {
            let answers = answered.len();
            self.tell(format!(
                "key {i}: {replayed} of {answers} answers say they were replayed"
            ));
            self.replays_wrong += 1;
        }
    }
}

/// The `p`th percentile of `sorted` (0 when empty).
fn percentile(sorted: &[u64], p: usize) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) * p) / 100]
}

fn parse() -> Result<Settings, String> {
    let mut settings = Settings {
        redis: Vec::new(),
        cluster: false,
        targets: Vec::new(),
        keys: 1000,
        copies: 5,
        tenants: 10,
        concurrency: 32,
        work_ms: 10,
        run: format!("run{:08x}", rand::random::<u32>()),
        pause_pids: Vec::new(),
        pauses: 0,
        pause_ms: 1_500,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--cluster" {
            settings.cluster = true;
            continue;
        }
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let number = || {
            value
                .parse::<usize>()
                .map_err(|_| format!("{flag}: not a number"))
        };
        match flag.as_str() {
            "--redis" => settings.redis.push(value.clone()),
            "--targets" => settings.targets = value.split(',').map(str::to_owned).collect(),
            "--keys" => settings.keys = number()?,
            "--copies" => settings.copies = number()?,
            "--tenants" => settings.tenants = number()?,
            "--concurrency" => settings.concurrency = number()?,
            "--work-ms" => settings.work_ms = number()? as u64,
            "--run" => settings.run = value.clone(),
            "--pause-pids" => {
                let pids = value.split(',').map(|pid| pid.parse::<u32>());
                settings.pause_pids = pids
                    .collect::<Result<_, _>>()
                    .map_err(|_| format!("{flag}: not process ids"))?;
            }
            "--pauses" => settings.pauses = number()?,
            "--pause-ms" => settings.pause_ms = number()? as u64,
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    if settings.redis.is_empty() {
        settings.redis.push("redis://127.0.0.1:6379".into());
    }
    if settings.pauses > 0 && settings.pause_pids.is_empty() {
        return Err("--pauses needs --pause-pids".into());
    }
    if settings.targets.is_empty()
        || settings.keys == 0
        || settings.copies == 0
        || settings.tenants == 0
        || settings.concurrency == 0
    {
        return Err("need --targets, and --keys, --copies, --tenants, --concurrency over 0".into());
    }
    Ok(settings)
}
