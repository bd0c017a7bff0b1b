//! The Tower layer against a real redis-server: two `LockClient`s stand for two instances of
//! a service, each with its own stack.

mod support;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use support::{RedisServer, client};
use tokio::sync::{Barrier, oneshot};
use tower::util::BoxCloneSyncService;
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_redis_lock::layer::{
    OnLeaseLost, OnMissingKey, OnRedisUnavailable, Rejection, RejectionKind,
};
use tower_redis_lock::{HeaderKey, Lease, LockClient, LockContext, LockLayer};

/// Bound for waits that normally take milliseconds; generous because CI machines are shared.
const SLACK: Duration = Duration::from_secs(5);

type Http = BoxCloneSyncService<Request<String>, Response<String>, Infallible>;

/// Counts handlers running per key, and remembers the most that ever ran at once.
#[derive(Clone, Default)]
struct Overlap {
    running: Arc<Mutex<HashMap<String, usize>>>,
    worst: Arc<Mutex<usize>>,
}

impl Overlap {
    fn enter(&self, key: &str) {
        let mut running = self.running.lock().unwrap();
        let now = running.entry(key.to_owned()).or_default();
        *now += 1;
        let mut worst = self.worst.lock().unwrap();
        *worst = (*worst).max(*now);
    }

    fn leave(&self, key: &str) {
        *self.running.lock().unwrap().get_mut(key).unwrap() -= 1;
    }

    /// Most handlers that ever ran at once for one key.
    fn worst_per_key(&self) -> usize {
        *self.worst.lock().unwrap()
    }
}

/// A handler that records overlap under its locks, works for `work`, and answers with its
/// fencing token (or `unlocked`).
fn recording_handler(overlap: Overlap, work: Duration) -> Http {
    BoxCloneSyncService::new(service_fn(move |request: Request<String>| {
        let overlap = overlap.clone();
        async move {
            let context = request.extensions().get::<LockContext>().cloned();
            let Some(context) = context else {
                return Ok(Response::new("unlocked".to_owned()));
            };
            let keys: Vec<String> = context.keys().map(str::to_owned).collect();
            for key in &keys {
                overlap.enter(key);
            }
            tokio::time::sleep(work).await;
            for key in &keys {
                overlap.leave(key);
            }
            Ok(Response::new(context.fencing_token().to_string()))
        }
    }))
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

async fn send(service: &Http, request: Request<String>) -> Response<String> {
    service.clone().oneshot(request).await.unwrap()
}

fn tenant_layer(locks: &LockClient) -> LockLayer<HeaderKey> {
    LockLayer::new(locks.clone(), HeaderKey::new("x-tenant-id"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_for_one_key_run_one_at_a_time_across_two_instances() {
    let server = RedisServer::start();
    let overlap = Overlap::default();
    let mut instances = Vec::new();
    for _ in 0..2 {
        let locks = client(&server).await;
        let handler = recording_handler(overlap.clone(), Duration::from_millis(5));
        instances.push(BoxCloneSyncService::new(
            tenant_layer(&locks).layer(handler),
        ));
    }
    let mut requests = Vec::new();
    for i in 0..40 {
        let instance = instances[i % 2].clone();
        requests.push(tokio::spawn(async move {
            send(&instance, tenant_request("acme")).await
        }));
    }
    let mut tokens = Vec::new();
    for request in requests {
        let response = request.await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        tokens.push(
            response
                .into_body()
                .parse::<u64>()
                .expect("a fencing token"),
        );
    }
    assert_eq!(overlap.worst_per_key(), 1);
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), 40, "every request had its own fencing token");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_for_different_keys_run_in_parallel() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    // Both handlers must be inside at once to pass the barrier: serialized, they never would.
    let barrier = Arc::new(Barrier::new(2));
    let handler = service_fn(move |_request: Request<String>| {
        let barrier = barrier.clone();
        async move {
            barrier.wait().await;
            Ok::<_, Infallible>(Response::new(String::new()))
        }
    });
    let service = BoxCloneSyncService::new(tenant_layer(&locks).layer(handler));
    let both = futures_util::future::join(
        send(&service, tenant_request("acme")),
        send(&service, tenant_request("globex")),
    );
    let (a, b) = tokio::time::timeout(SLACK, both)
        .await
        .expect("ran in parallel");
    assert_eq!((a.status(), b.status()), (StatusCode::OK, StatusCode::OK));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_key_requests_in_opposite_orders_do_not_deadlock() {
    let server = RedisServer::start();
    let overlap = Overlap::default();
    // A transfer names both accounts: "x-transfer: from,to".
    let accounts = |request: &Request<String>| -> Vec<String> {
        let header = request.headers()["x-transfer"].to_str().unwrap();
        header.split(',').map(str::to_owned).collect()
    };
    let mut instances = Vec::new();
    for _ in 0..2 {
        let locks = client(&server).await;
        let handler = recording_handler(overlap.clone(), Duration::from_millis(2));
        instances.push(BoxCloneSyncService::new(
            LockLayer::new(locks, accounts).layer(handler),
        ));
    }
    let mut requests = Vec::new();
    for i in 0..40 {
        let instance = instances[i % 2].clone();
        let pair = if i % 2 == 0 { "alice,bob" } else { "bob,alice" };
        let request = Request::builder()
            .header("x-transfer", pair)
            .body(String::new())
            .unwrap();
        requests.push(tokio::spawn(async move { send(&instance, request).await }));
    }
    let all = futures_util::future::join_all(requests);
    let responses = tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("no deadlock");
    for response in responses {
        assert_eq!(response.unwrap().status(), StatusCode::OK);
    }
    assert_eq!(overlap.worst_per_key(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_past_the_bound_is_503_with_retry_after_or_grpc_unavailable() {
    let server = RedisServer::start();
    let (locks, other) = (client(&server).await, client(&server).await);
    let _held = other.lock("busy").unwrap().acquire().await.unwrap();
    let layer = tenant_layer(&locks).wait_timeout(Duration::from_millis(200));
    let service = BoxCloneSyncService::new(
        layer.layer(recording_handler(Overlap::default(), Duration::ZERO)),
    );

    let http = send(&service, tenant_request("busy")).await;
    assert_eq!(http.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(http.headers()["retry-after"], "1");
    let grpc = send(&service, grpc(tenant_request("busy"))).await;
    assert_eq!(grpc.status(), StatusCode::OK);
    assert_eq!(grpc.headers()["grpc-status"], "14");
    assert_eq!(grpc.headers()["content-type"], "application/grpc");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_redis_fails_closed_by_default_or_open_on_request() {
    let locks = support::client_on_silent_port(support::free_port()).await;
    let handler = recording_handler(Overlap::default(), Duration::ZERO);
    let closed = BoxCloneSyncService::new(tenant_layer(&locks).layer(handler.clone()));
    let http = send(&closed, tenant_request("acme")).await;
    assert_eq!(http.status(), StatusCode::SERVICE_UNAVAILABLE);
    let grpc = send(&closed, grpc(tenant_request("acme"))).await;
    assert_eq!(grpc.headers()["grpc-status"], "14");

    let open_layer = tenant_layer(&locks).on_redis_unavailable(OnRedisUnavailable::FailOpen);
    let open = BoxCloneSyncService::new(open_layer.layer(handler));
    let response = send(&open, tenant_request("acme")).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.into_body(), "unlocked");
}

/// A handler that waits far longer than its lease, and says whether it saw the loss.
fn slow_handler(work: Duration) -> Http {
    BoxCloneSyncService::new(service_fn(move |request: Request<String>| async move {
        let context = request.extensions().get::<LockContext>().cloned().unwrap();
        tokio::time::sleep(work).await;
        Ok(Response::new(format!("lost={}", context.is_lost())))
    }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_lost_mid_handler_cancels_it_or_lets_it_finish() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let lease = Duration::from_millis(300);
    let cancel = tenant_layer(&locks).lease(Lease::Fixed(lease));
    let cancelled = BoxCloneSyncService::new(cancel.layer(slow_handler(Duration::from_secs(60))));
    let http = tokio::time::timeout(SLACK, send(&cancelled, tenant_request("lease")))
        .await
        .expect("cancelled when the lease ran out, not after 60 s");
    assert_eq!(http.status(), StatusCode::SERVICE_UNAVAILABLE);
    let grpc = tokio::time::timeout(SLACK, send(&cancelled, grpc(tenant_request("lease"))))
        .await
        .unwrap();
    assert_eq!(grpc.headers()["grpc-status"], "10");

    let finish = tenant_layer(&locks)
        .lease(Lease::Fixed(lease))
        .on_lease_lost(OnLeaseLost::Finish);
    let finishing = BoxCloneSyncService::new(finish.layer(slow_handler(lease * 3)));
    let response = send(&finishing, tenant_request("lease")).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.into_body(), "lost=true");
}

#[tokio::test]
async fn requests_without_a_key_pass_through_or_are_rejected() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let handler = recording_handler(Overlap::default(), Duration::ZERO);
    let no_key = || Request::builder().body(String::new()).unwrap();

    let passing = BoxCloneSyncService::new(tenant_layer(&locks).layer(handler.clone()));
    let response = send(&passing, no_key()).await;
    assert_eq!(
        (response.status(), response.body().as_str()),
        (StatusCode::OK, "unlocked")
    );

    let strict = tenant_layer(&locks).on_missing_key(OnMissingKey::Reject);
    let rejecting = BoxCloneSyncService::new(strict.layer(handler));
    assert_eq!(
        send(&rejecting, no_key()).await.status(),
        StatusCode::BAD_REQUEST
    );
    let grpc = send(&rejecting, grpc(no_key())).await;
    assert_eq!(grpc.headers()["grpc-status"], "3");
}

#[tokio::test]
async fn bad_keys_are_400_and_never_reach_redis() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let handler = recording_handler(Overlap::default(), Duration::ZERO);
    let service = BoxCloneSyncService::new(tenant_layer(&locks).layer(handler.clone()));

    let binary = Request::builder()
        .header("x-tenant-id", &b"\xffacme"[..])
        .body(String::new())
        .unwrap();
    assert_eq!(
        send(&service, binary).await.status(),
        StatusCode::BAD_REQUEST
    );
    let oversize = "x".repeat(tower_redis_lock::MAX_NAME_LEN + 1);
    assert_eq!(
        send(&service, tenant_request(&oversize)).await.status(),
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        send(&service, tenant_request("")).await.status(),
        StatusCode::BAD_REQUEST
    );

    let many = |_request: &Request<String>| (0..17).map(|i| format!("k{i}")).collect::<Vec<_>>();
    let greedy = BoxCloneSyncService::new(LockLayer::new(locks.clone(), many).layer(handler));
    assert_eq!(
        send(&greedy, tenant_request("acme")).await.status(),
        StatusCode::BAD_REQUEST
    );
    assert_eq!(server.keys_besides_epoch(), 0, "no key reached redis");
}

#[tokio::test]
async fn a_rejection_hook_builds_the_answer() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let too_busy = |rejection: &Rejection| {
        assert_eq!(rejection.kind(), RejectionKind::MissingKey);
        Response::builder()
            .status(StatusCode::TOO_MANY_REQUESTS)
            .body(format!("no: {}", rejection.detail()))
            .unwrap()
    };
    let layer = tenant_layer(&locks)
        .on_missing_key(OnMissingKey::Reject)
        .rejection(too_busy);
    let service = BoxCloneSyncService::new(
        layer.layer(recording_handler(Overlap::default(), Duration::ZERO)),
    );
    let response = send(&service, Request::new(String::new())).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(response.body().starts_with("no: "));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_request_future_releases_its_lock() {
    let server = RedisServer::start();
    let (locks, other) = (client(&server).await, client(&server).await);
    let (entered_tx, entered_rx) = oneshot::channel::<()>();
    let entered_tx = Arc::new(Mutex::new(Some(entered_tx)));
    let handler = service_fn(move |_request: Request<String>| {
        let entered_tx = entered_tx.clone();
        async move {
            entered_tx.lock().unwrap().take().unwrap().send(()).unwrap();
            std::future::pending::<()>().await;
            Ok::<_, Infallible>(Response::new(String::new()))
        }
    });
    let mut service = tenant_layer(&locks).layer(handler);
    let call = service
        .ready()
        .await
        .unwrap()
        .call(tenant_request("dropped"));
    let running = tokio::spawn(call);
    entered_rx.await.unwrap();
    assert!(other.lock("dropped").unwrap().is_locked().await.unwrap());

    running.abort();
    assert!(running.await.unwrap_err().is_cancelled());
    let guard = support::acquire_within(
        &other,
        "dropped",
        SLACK,
        "released when the request future was dropped, not after the 30 s lease",
    )
    .await;
    assert!(guard.is_held());
}

#[tokio::test]
async fn the_layer_is_always_ready_and_readies_the_inner_service_once_the_lock_is_held() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let (mock, mut handle) = tower_test::mock::pair::<Request<String>, Response<String>>();
    let mut service = tenant_layer(&locks).layer(mock);

    handle.allow(0);
    let mut task = tower_test::mock::Spawn::new(service.clone());
    assert!(
        task.poll_ready().is_ready(),
        "ready whatever the inner service says: it is reserved only under the lock"
    );
    drop(task);

    // The mock panics if a clone that was not polled ready is called.
    let call = service.ready().await.unwrap().call(tenant_request("ready"));
    let respond = async {
        let lock = locks.lock("ready").unwrap();
        let started = std::time::Instant::now();
        while !lock.is_locked().await.unwrap() {
            assert!(
                started.elapsed() < SLACK,
                "the lock is taken while the inner service is not ready"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        handle.allow(1);
        let (request, reply) = handle.next_request().await.expect("the request arrives");
        assert!(request.extensions().get::<LockContext>().is_some());
        reply.send_response(Response::new("done".to_owned()));
    };
    let (response, ()) = tokio::join!(call, respond);
    assert_eq!(response.unwrap().into_body(), "done");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_response_does_not_wait_for_the_release_and_a_later_request_waits_for_it() {
    const PAUSE: Duration = Duration::from_secs(4);
    let server = RedisServer::start();
    let locks = client(&server).await;
    let url = server.url();
    // On request, the handler stalls every write at the server just before it answers, so
    // the release that follows the response (a script) cannot run for a while.
    let handler = BoxCloneSyncService::new(service_fn(move |request: Request<String>| {
        let url = url.clone();
        async move {
            let context = request.extensions().get::<LockContext>().cloned().unwrap();
            if request.headers().contains_key("x-stall-writes") {
                let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
                let () = redis::cmd("CLIENT")
                    .arg(&["PAUSE", &PAUSE.as_millis().to_string(), "WRITE"])
                    .query(&mut conn)
                    .unwrap();
            }
            Ok::<_, Infallible>(Response::new(context.waited().as_millis().to_string()))
        }
    }));
    let service: Http = BoxCloneSyncService::new(tenant_layer(&locks).layer(handler));
    // Warm the connection and the scripts, so the first request below takes no detour.
    send(&service, tenant_request("acme")).await;

    let mut stalled = tenant_request("acme");
    stalled
        .headers_mut()
        .insert("x-stall-writes", "1".parse().unwrap());
    let started = std::time::Instant::now();
    let first = send(&service, stalled).await;
    let answered_in = started.elapsed();
    assert_eq!(first.status(), StatusCode::OK);
    assert!(
        answered_in < PAUSE / 2,
        "answered in {answered_in:?}, without waiting for the stalled release"
    );
    let still_held: i64 = server.cmd(&["EXISTS", "lock:{acme}"]);
    assert_eq!(
        still_held, 1,
        "the release had not run when the response came"
    );

    // The next request for the key in this process queues behind that release, which runs
    // once the pause ends: at the soonest a pause after the first request was sent.
    let pause_left = PAUSE.saturating_sub(started.elapsed());
    let second = send(&service, tenant_request("acme")).await;
    assert_eq!(second.status(), StatusCode::OK);
    let waited_ms: u64 = second.into_body().parse().unwrap();
    assert!(
        waited_ms >= pause_left.as_millis() as u64,
        "the second request waited {waited_ms} ms for the release, {pause_left:?} of the pause \
         were left when it was sent"
    );
    assert!(
        pause_left >= PAUSE / 4,
        "the second request was sent {pause_left:?} before the pause ended: too late to tell"
    );
}

/// A handler that answers with the request's tenant; the tenant `hot` waits for a permit of
/// `gate` first.
fn gated_handler(
    gate: Arc<tokio::sync::Semaphore>,
) -> impl Service<Request<String>, Response = Response<String>, Error = Infallible, Future: Send>
+ Clone
+ Send
+ 'static {
    service_fn(move |request: Request<String>| {
        let gate = gate.clone();
        async move {
            let tenant = request.headers()["x-tenant-id"]
                .to_str()
                .unwrap()
                .to_owned();
            if tenant == "hot" {
                gate.acquire().await.unwrap().forget();
            }
            Ok::<_, Infallible>(Response::new(tenant))
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_for_its_lock_leaves_the_inner_services_capacity_to_others() {
    let server = RedisServer::start();
    let (here, there) = (client(&server).await, client(&server).await);
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    // Two requests at most in the handler at once, shared by both instances' stacks.
    let inner = tower::limit::ConcurrencyLimit::new(gated_handler(gate.clone()), 2);
    let first = tenant_layer(&here).layer(inner.clone());
    let second = tenant_layer(&there).layer(inner);

    // One `hot` request holds the lock and one permit; another waits for the lock.
    let holding = tokio::spawn(first.clone().oneshot(tenant_request("hot")));
    let lock = here.lock("hot").unwrap();
    let started = std::time::Instant::now();
    while !lock.is_locked().await.unwrap() {
        assert!(
            started.elapsed() < SLACK,
            "the first request takes the lock"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let waiting = tokio::spawn(second.clone().oneshot(tenant_request("hot")));
    assert!(
        support::eventually(SLACK, || support::queued(&server, "hot").len() == 1).await,
        "the second request waits for the lock"
    );

    // The second permit is free for another tenant: the waiting request holds none.
    let cold = tokio::time::timeout(SLACK, second.clone().oneshot(tenant_request("cold")))
        .await
        .expect("a request of another tenant runs while a hot one waits for its lock")
        .unwrap();
    assert_eq!(cold.into_body(), "cold");
    assert!(!holding.is_finished() && !waiting.is_finished());

    gate.add_permits(2);
    for request in [holding, waiting] {
        let response = tokio::time::timeout(SLACK, request).await.unwrap().unwrap();
        assert_eq!(response.unwrap().into_body(), "hot");
    }
}

/// An inner service that has failed: it is never ready again.
#[derive(Clone)]
struct Broken;

impl Service<Request<String>> for Broken {
    type Response = Response<String>;
    type Error = &'static str;
    type Future = std::future::Ready<Result<Response<String>, &'static str>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Err("broken"))
    }

    fn call(&mut self, _: Request<String>) -> Self::Future {
        panic!("a service that is not ready is never called")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inner_service_that_fails_to_get_ready_gives_its_error_and_the_lock_back() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let service = tenant_layer(&locks).layer(Broken);
    let outcome = service.oneshot(tenant_request("broken")).await;
    assert_eq!(outcome.unwrap_err(), "broken");
    let lock = locks.lock("broken").unwrap();
    let started = std::time::Instant::now();
    while lock.is_locked().await.unwrap() {
        assert!(
            started.elapsed() < SLACK,
            "the lock is released after the error"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let left: i64 = server.cmd(&[
        "EXISTS",
        "lock:{broken}",
        "lock:{broken}:queue",
        "lock:{broken}:waiters",
    ]);
    assert_eq!(left, 0, "no hold or place is left in Redis");
}
