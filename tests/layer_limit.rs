//! The layer's per-key limit (`LockLayer::limit`) against a real redis-server: at most `n`
//! handlers per key across two instances (and `n` reached), other keys never held back by a
//! busy one, a request with several keys taking a permit of each without deadlock, 503 with
//! `Retry-After` (gRPC `UNAVAILABLE`) past the wait bound, a 500 (gRPC `INTERNAL`) when two
//! instances disagree on `n`, dropped requests giving back their permit and their place, the
//! lost signal reaching the handler, and `limit(0)` refused. Each `LockClient` stands for one
//! instance of a service, with its own stack.

mod support;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{Request, Response, StatusCode};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use support::logs::CapturedLogs;
use support::{RedisServer, client, eventually};
use tokio::sync::Semaphore as Gate;
use tokio::task::JoinHandle;
use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceExt, service_fn};
use tower_redis_lock::layer::Sharing;
use tower_redis_lock::{HeaderKey, Lease, LockClient, LockContext, LockLayer};

/// Bound for waits that normally take milliseconds; generous because CI machines are shared
/// and a debug build on two cores can stall for a while.
const SLACK: Duration = Duration::from_secs(10);

type Http = BoxCloneSyncService<Request<String>, Response<String>, Infallible>;

/// Handlers running per key now, and the most that ever ran at once per key.
#[derive(Clone, Default)]
struct Inside {
    /// Per key: (running now, most at once).
    counts: Arc<Mutex<HashMap<String, (usize, usize)>>>,
}

/// One handler's presence under `key`; it leaves when dropped, so a handler whose future is
/// dropped mid-way leaves too.
struct Presence {
    inside: Inside,
    key: String,
}

impl Drop for Presence {
    fn drop(&mut self) {
        let mut counts = self.inside.counts.lock().unwrap();
        counts.get_mut(&self.key).unwrap().0 -= 1;
    }
}

impl Inside {
    fn enter(&self, key: &str) -> Presence {
        let mut counts = self.counts.lock().unwrap();
        let (now, most) = counts.entry(key.to_owned()).or_default();
        *now += 1;
        *most = (*most).max(*now);
        Presence {
            inside: self.clone(),
            key: key.to_owned(),
        }
    }

    fn now(&self, key: &str) -> usize {
        self.counts
            .lock()
            .unwrap()
            .get(key)
            .map_or(0, |counts| counts.0)
    }

    fn most(&self, key: &str) -> usize {
        self.counts
            .lock()
            .unwrap()
            .get(key)
            .map_or(0, |counts| counts.1)
    }
}

/// A handler that counts itself inside each of its keys, waits for a pass of `gate` when
/// its key is `gated` (every key when `None`), works for `work`, and answers with each key's
/// fencing token: `alice=7,bob=9`.
fn handler(inside: Inside, gate: Arc<Gate>, gated: Option<&'static str>, work: Duration) -> Http {
    BoxCloneSyncService::new(service_fn(move |request: Request<String>| {
        let (inside, gate) = (inside.clone(), gate.clone());
        async move {
            let context = request.extensions().get::<LockContext>().cloned().unwrap();
            let keys: Vec<String> = context.keys().map(str::to_owned).collect();
            let _present: Vec<Presence> = keys.iter().map(|key| inside.enter(key)).collect();
            if gated.is_none_or(|gated| keys.iter().any(|key| key == gated)) {
                // Passing takes a pass and gives it back: one pass lets every handler by.
                drop(gate.acquire().await.unwrap());
            }
            tokio::time::sleep(work).await;
            let tokens: Vec<String> = keys
                .iter()
                .map(|key| format!("{key}={}", context.fencing_token_of(key).unwrap()))
                .collect();
            Ok(Response::new(tokens.join(",")))
        }
    }))
}

/// A gate every handler passes at once.
fn open_gate() -> Arc<Gate> {
    Arc::new(Gate::new(Gate::MAX_PERMITS))
}

fn tenant_request(tenant: &str) -> Request<String> {
    Request::builder()
        .uri("/orders")
        .header("x-tenant-id", tenant)
        .body(String::new())
        .unwrap()
}

fn grpc(mut request: Request<String>) -> Request<String> {
    request
        .headers_mut()
        .insert("content-type", "application/grpc".parse().unwrap());
    request
}

fn limited(locks: &LockClient, n: u32) -> LockLayer<HeaderKey> {
    LockLayer::new(locks.clone(), HeaderKey::new("x-tenant-id")).limit(n)
}

fn spawn_call(service: &Http, request: Request<String>) -> JoinHandle<Response<String>> {
    let service = service.clone();
    tokio::spawn(async move { service.oneshot(request).await.unwrap() })
}

/// The response of a spawned call, which must come within `SLACK`; `why` says what that
/// proves.
async fn answered(call: JoinHandle<Response<String>>, why: &str) -> Response<String> {
    tokio::time::timeout(SLACK, call)
        .await
        .unwrap_or_else(|_| panic!("no answer within {SLACK:?}: {why}"))
        .unwrap()
}

/// How many permits Redis counts as held for the key `name` (default prefix).
fn used(server: &RedisServer, name: &str) -> u32 {
    let used: Option<u32> = server.cmd(&["HGET", &format!("lock:{{{name}}}:semaphore"), "used"]);
    used.unwrap_or(0)
}

/// The owner ids queued in Redis for the key `name`'s permits.
fn queued(server: &RedisServer, name: &str) -> Vec<String> {
    server.cmd(&[
        "ZRANGE",
        &format!("lock:{{{name}}}:semaphore:queue"),
        "0",
        "-1",
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_n_requests_per_key_run_at_once_across_two_instances_and_n_is_reached() {
    const LIMIT: u32 = 3;
    let server = RedisServer::start();
    let inside = Inside::default();
    let mut instances = Vec::new();
    for _ in 0..2 {
        let locks = client(&server).await;
        // Long enough for the requests of both instances to pile up behind the limit.
        let work = Duration::from_millis(10);
        let stack = handler(inside.clone(), open_gate(), None, work);
        instances.push(BoxCloneSyncService::new(
            limited(&locks, LIMIT).layer(stack),
        ));
    }
    let mut calls = Vec::new();
    for i in 0..80 {
        let tenant = if i % 4 == 3 { "globex" } else { "acme" };
        calls.push((
            tenant,
            spawn_call(&instances[i % 2], tenant_request(tenant)),
        ));
    }
    let mut tokens: HashMap<&str, Vec<String>> = HashMap::new();
    for (tenant, call) in calls {
        let response = tokio::time::timeout(SLACK * 3, call)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{}", response.body());
        tokens.entry(tenant).or_default().push(response.into_body());
    }
    for tenant in ["acme", "globex"] {
        let most = inside.most(tenant);
        assert!(most <= LIMIT as usize, "{most} {tenant} handlers at once");
        let mut seen = tokens[tenant].clone();
        let runs = seen.len();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(
            seen.len(),
            runs,
            "two {tenant} handlers shared a fencing token"
        );
    }
    assert_eq!(
        inside.most("acme"),
        LIMIT as usize,
        "60 requests for acme never filled its limit"
    );
    assert!(
        eventually(SLACK, || used(&server, "acme") == 0
            && used(&server, "globex") == 0)
        .await,
        "every permit was given back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_at_its_limit_holds_back_no_other_key() {
    let server = RedisServer::start();
    let (here, there) = (client(&server).await, client(&server).await);
    let inside = Inside::default();
    let gate = Arc::new(Gate::new(0));
    let stack = handler(inside.clone(), gate.clone(), Some("hot"), Duration::ZERO);
    let first = BoxCloneSyncService::new(limited(&here, 2).layer(stack.clone()));
    let second = BoxCloneSyncService::new(limited(&there, 2).layer(stack));

    let running = [
        spawn_call(&first, tenant_request("hot")),
        spawn_call(&second, tenant_request("hot")),
    ];
    assert!(
        eventually(SLACK, || inside.now("hot") == 2).await,
        "two hot requests run at once"
    );
    let waiting = spawn_call(&first, tenant_request("hot"));
    assert!(
        eventually(SLACK, || queued(&server, "hot").len() == 1).await,
        "the third hot request waits for a permit"
    );

    for stack in [&first, &second] {
        let cold = answered(
            spawn_call(stack, tenant_request("cold")),
            "a request of another key runs while hot is at its limit",
        )
        .await;
        assert_eq!(cold.status(), StatusCode::OK);
    }
    assert!(!waiting.is_finished());
    assert_eq!(inside.now("hot"), 2);

    gate.add_permits(3);
    for call in running.into_iter().chain([waiting]) {
        let response = answered(call, "the gate is open").await;
        assert_eq!(response.status(), StatusCode::OK);
    }
    assert_eq!(inside.most("hot"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_with_several_keys_take_a_permit_of_each_in_one_order_without_deadlock() {
    const LIMIT: u32 = 2;
    let server = RedisServer::start();
    let inside = Inside::default();
    // A transfer names both accounts: "x-transfer: from,to".
    let accounts = |request: &Request<String>| -> Vec<String> {
        let header = request.headers()["x-transfer"].to_str().unwrap();
        header.split(',').map(str::to_owned).collect()
    };
    let mut instances = Vec::new();
    for _ in 0..2 {
        let locks = client(&server).await;
        let stack = handler(inside.clone(), open_gate(), None, Duration::from_millis(5));
        let layer = LockLayer::new(locks, accounts).limit(LIMIT);
        instances.push(BoxCloneSyncService::new(layer.layer(stack)));
    }
    let mut calls = Vec::new();
    for i in 0..40 {
        let pair = if i % 2 == 0 { "alice,bob" } else { "bob,alice" };
        let request = Request::builder()
            .header("x-transfer", pair)
            .body(String::new())
            .unwrap();
        calls.push(spawn_call(&instances[i % 2], request));
    }
    let all = futures_util::future::join_all(calls);
    // Forty requests of 5 ms, two at a time: seconds at worst, unless they deadlock.
    let responses = tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("no deadlock");
    for response in responses {
        let response = response.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        // Both keys' tokens, in the canonical order whatever order the request named them.
        let keys: Vec<&str> = response
            .body()
            .split(',')
            .map(|held| held.split('=').next().unwrap())
            .collect();
        assert_eq!(keys, ["alice", "bob"], "{}", response.body());
    }
    for account in ["alice", "bob"] {
        assert!(inside.most(account) <= LIMIT as usize, "{account}");
    }
    assert_eq!(
        inside.most("alice"),
        LIMIT as usize,
        "the limit was reached"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_limit_past_the_wait_bound_is_503_with_retry_after_or_grpc_unavailable() {
    const WAIT: Duration = Duration::from_millis(300);
    let server = RedisServer::start();
    let (locks, other) = (client(&server).await, client(&server).await);
    // Another instance's holders have both permits of the key.
    let held = other
        .semaphore("busy", 2)
        .unwrap()
        .acquire_many(2)
        .await
        .unwrap();
    let inside = Inside::default();
    let stack = handler(inside.clone(), open_gate(), None, Duration::ZERO);
    let service = limited(&locks, 2).wait_timeout(WAIT).layer(stack);

    let started = Instant::now();
    let http = service
        .clone()
        .oneshot(tenant_request("busy"))
        .await
        .unwrap();
    assert!(started.elapsed() >= WAIT, "answered before the wait bound");
    assert_eq!(http.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(http.headers()["retry-after"], "1");
    assert_eq!(http.body(), "lock wait timed out for [busy]; retry later\n");
    let grpc = service.oneshot(grpc(tenant_request("busy"))).await.unwrap();
    assert_eq!(grpc.status(), StatusCode::OK);
    assert_eq!(grpc.headers()["grpc-status"], "14", "UNAVAILABLE");
    assert_eq!(grpc.headers()["content-type"], "application/grpc");

    assert_eq!(inside.most("busy"), 0, "no handler ran over the limit");
    assert!(
        eventually(SLACK, || queued(&server, "busy").is_empty()).await,
        "the timed-out requests left no place in the queue"
    );
    assert_eq!(used(&server, "busy"), 2);
    held.release().await.unwrap();
}

/// The `redis_lock_layer_rejections_total` count of `reason` in `recorder`.
fn rejections(recorder: &DebuggingRecorder, reason: &str) -> u64 {
    recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| {
            let key = key.key();
            key.name() == "redis_lock_layer_rejections_total"
                && key
                    .labels()
                    .any(|label| label.key() == "reason" && label.value() == reason)
        })
        .map(|(.., value)| match value {
            DebugValue::Counter(count) => count,
            _ => 0,
        })
        .sum()
}

// A current-thread runtime: the log capture and the metrics recorder are this thread's.
#[tokio::test]
async fn instances_that_disagree_on_the_limit_answer_500_counted_and_logged() {
    let logs = CapturedLogs::start();
    // Leaked: the guard borrows the recorder for the whole test.
    let recorder: &'static DebuggingRecorder = Box::leak(Box::new(DebuggingRecorder::new()));
    let _recording = metrics::set_default_local_recorder(recorder);
    let server = RedisServer::start();
    let (three, five) = (client(&server).await, client(&server).await);
    let inside = Inside::default();
    let gate = Arc::new(Gate::new(0));
    let stack = handler(inside.clone(), gate.clone(), None, Duration::ZERO);
    let old = BoxCloneSyncService::new(limited(&three, 3).layer(stack.clone()));
    let new = BoxCloneSyncService::new(limited(&five, 5).layer(stack));

    // An instance limited to 3 runs a request: Redis holds the key's count as 3.
    let running = spawn_call(&old, tenant_request("acme"));
    assert!(eventually(SLACK, || inside.now("acme") == 1).await);

    let http = new.clone().oneshot(tenant_request("acme")).await.unwrap();
    assert_eq!(http.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(http.headers().get("retry-after").is_none());
    assert_eq!(
        http.body(),
        "concurrency limit configured differently across instances for [acme]\n"
    );
    let grpc = new
        .clone()
        .oneshot(grpc(tenant_request("acme")))
        .await
        .unwrap();
    assert_eq!(grpc.headers()["grpc-status"], "13", "INTERNAL");
    assert_eq!(
        inside.most("acme"),
        1,
        "the disagreeing requests did not run"
    );
    if cfg!(feature = "metrics") {
        assert_eq!(rejections(recorder, "permits_mismatch"), 2);
    }
    let logged = logs.lines_with("disagree on the layer's limit");
    assert!(
        logged.first().is_some_and(|line| line.contains("ERROR")),
        "{logged:?}"
    );
    // The request of the instance limited to 3 still runs, on its permit.
    assert_eq!(used(&server, "acme"), 1);

    // Once nobody holds the key, the next count stands.
    gate.add_permits(1);
    assert_eq!(
        answered(running, "the gate is open").await.status(),
        StatusCode::OK
    );
    assert!(eventually(SLACK, || used(&server, "acme") == 0).await);
    let later = new.oneshot(tenant_request("acme")).await.unwrap();
    assert_eq!(later.status(), StatusCode::OK, "{}", later.body());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_request_gives_back_its_permit_or_its_place() {
    let server = RedisServer::start();
    let (locks, other) = (client(&server).await, client(&server).await);
    let inside = Inside::default();
    let gate = Arc::new(Gate::new(0));
    let stack = handler(inside.clone(), gate.clone(), None, Duration::ZERO);
    let service = BoxCloneSyncService::new(limited(&locks, 2).layer(stack));

    let running = [
        spawn_call(&service, tenant_request("acme")),
        spawn_call(&service, tenant_request("acme")),
    ];
    assert!(eventually(SLACK, || inside.now("acme") == 2).await);
    let waiting = spawn_call(&service, tenant_request("acme"));
    assert!(
        eventually(SLACK, || queued(&server, "acme").len() == 1).await,
        "the third request waits in the queue"
    );

    // A waiting request dropped: its place goes, and no permit is taken for it.
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    assert!(
        eventually(SLACK, || queued(&server, "acme").is_empty()).await,
        "the dropped waiter left the queue"
    );
    assert_eq!(used(&server, "acme"), 2);

    // A running request dropped: its permit comes back at once, not after the 30 s lease.
    let [first, second] = running;
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    assert!(
        eventually(SLACK, || used(&server, "acme") == 1).await,
        "the dropped request's permit was given back"
    );
    let permit = other
        .semaphore("acme", 2)
        .unwrap()
        .acquire_timeout(SLACK)
        .await
        .expect("the freed permit is free for anyone");
    permit.release().await.unwrap();

    gate.add_permits(1);
    assert_eq!(
        answered(second, "the gate is open").await.status(),
        StatusCode::OK
    );
    assert!(eventually(SLACK, || used(&server, "acme") == 0).await);
    assert_eq!(inside.now("acme"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_lost_mid_handler_cancels_it_as_a_lost_lock_does() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let gate = Arc::new(Gate::new(0));
    let stack = handler(Inside::default(), gate, None, Duration::ZERO);
    // A fixed lease, never renewed: it runs out while the handler waits for a closed gate.
    let layer = limited(&locks, 2).lease(Lease::Fixed(Duration::from_millis(300)));
    let service = layer.layer(stack);
    let http = tokio::time::timeout(SLACK, service.clone().oneshot(tenant_request("acme")))
        .await
        .expect("cancelled when the lease ran out, not left waiting")
        .unwrap();
    assert_eq!(http.status(), StatusCode::SERVICE_UNAVAILABLE);
    let grpc = tokio::time::timeout(SLACK, service.oneshot(grpc(tenant_request("acme"))))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(grpc.headers()["grpc-status"], "10", "ABORTED");
}

#[tokio::test]
async fn a_limit_of_zero_is_refused_when_the_layer_is_built() {
    let locks = support::client_on_silent_port(support::free_port()).await;
    let layer = || LockLayer::new(locks.clone(), HeaderKey::new("x-tenant-id"));
    let limit = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| layer().limit(0)));
    let sharing = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        layer().sharing(Sharing::Limit(0))
    }));
    for refused in [limit, sharing] {
        let panic = refused.expect_err("refused");
        let message = panic
            .downcast_ref::<&str>()
            .map(|message| (*message).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        assert!(
            message.contains("a limit must be at least 1"),
            "{message:?}"
        );
    }
    // One is the least limit, and fine.
    let _ = layer().limit(1);
}
