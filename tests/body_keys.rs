//! Lock keys from a JSON body (`JsonKeys`, feature `json`) in an axum router against a real
//! redis-server: a transfer locks both accounts while its handler runs, with its body
//! intact; opposite transfers never deadlock; losing either lease cancels the handler; a
//! body over the bound is 413 (declared or streamed), one without its keys or not JSON 400;
//! a per-key limit, fair and read-write sharing take the same keys; the handler's
//! `LockContext` has the fencing token of each account; and layers in the wrong order are
//! told plainly. Each `LockClient` stands for one instance of a service.

mod support;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures_util::StreamExt as _;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::{Request, StatusCode};
use serde::{Deserialize, Serialize};
use support::logs::CapturedLogs;
use support::{RedisServer, client, eventually};
use tokio::sync::{Semaphore as Gate, mpsc};
use tokio::task::JoinHandle;
use tower::ServiceExt;
use tower_redis_lock::layer::{InvalidKey, Keys, Rejection, Sharing};
use tower_redis_lock::{HeaderKey, IdempotencyLayer, JsonKeys, LockClient, LockContext, LockLayer};

/// Bound for what normally takes milliseconds; generous because CI machines are shared and
/// a debug build on two cores can stall for a while.
const SLACK: Duration = Duration::from_secs(10);

/// A gate that never closes: handlers answer at once.
const OPEN: usize = usize::MAX >> 4;

const TRANSFER: &str = r#"{"from_account":"a1","to_account":"a2","amount":5}"#;

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Transfer {
    from_account: String,
    to_account: String,
    amount: u64,
}

/// What a transfer handler saw when it started.
#[derive(Debug)]
struct Entered {
    transfer: Transfer,
    /// The lock names held, in the order they were taken.
    keys: Vec<String>,
    /// The fencing token of each account of the transfer.
    tokens: [Option<u64>; 2],
}

/// Where the handlers report, and what lets them finish.
#[derive(Clone)]
struct Desk {
    entered: mpsc::UnboundedSender<Entered>,
    /// One permit lets one handler finish.
    gate: Arc<Gate>,
    /// Handlers running per account: (now, most at once).
    inside: Arc<Mutex<HashMap<String, (usize, usize)>>>,
    finished: Arc<AtomicUsize>,
}

/// One handler's presence in its accounts; it leaves when dropped, so a cancelled handler
/// leaves too.
struct Presence {
    desk: Desk,
    keys: Vec<String>,
}

impl Drop for Presence {
    fn drop(&mut self) {
        let mut inside = self.desk.inside.lock().unwrap();
        for key in &self.keys {
            inside.get_mut(key).unwrap().0 -= 1;
        }
    }
}

impl Desk {
    /// A desk whose handlers wait for a permit of `gate` before they answer.
    fn new(gate: usize) -> (Self, mpsc::UnboundedReceiver<Entered>) {
        let (entered, reports) = mpsc::unbounded_channel();
        let desk = Self {
            entered,
            gate: Arc::new(Gate::new(gate)),
            inside: Arc::default(),
            finished: Arc::default(),
        };
        (desk, reports)
    }

    fn enter(&self, keys: &[String]) -> Presence {
        let mut inside = self.inside.lock().unwrap();
        for key in keys {
            let (now, most) = inside.entry(key.clone()).or_default();
            *now += 1;
            *most = (*most).max(*now);
        }
        Presence {
            desk: self.clone(),
            keys: keys.to_vec(),
        }
    }

    fn now(&self, key: &str) -> usize {
        self.inside.lock().unwrap().get(key).map_or(0, |c| c.0)
    }

    fn most(&self, key: &str) -> usize {
        self.inside.lock().unwrap().get(key).map_or(0, |c| c.1)
    }
}

/// Parses the body it was handed, reports, waits for the gate, and echoes the body.
async fn transfer(State(desk): State<Desk>, lock: LockContext, body: Bytes) -> Response {
    let transfer: Transfer = serde_json::from_slice(&body).expect("the body arrives intact");
    let keys: Vec<String> = lock.keys().map(str::to_owned).collect();
    let _presence = desk.enter(&keys);
    let tokens = [
        lock.fencing_token_of(&transfer.from_account),
        lock.fencing_token_of(&transfer.to_account),
    ];
    let _ = desk.entered.send(Entered {
        transfer,
        keys,
        tokens,
    });
    desk.gate.acquire().await.unwrap().forget();
    desk.finished.fetch_add(1, Ordering::SeqCst);
    body.into_response()
}

/// The transfer route behind `lock`, with `keys` read from the body (the body layer added
/// last, so it runs first).
fn transfers(desk: &Desk, lock: LockLayer<JsonKeys>, keys: &JsonKeys) -> Router {
    Router::new()
        .route("/transfers", post(transfer).get(transfer))
        .with_state(desk.clone())
        .layer(lock)
        .layer(keys.layer())
}

fn accounts() -> JsonKeys {
    JsonKeys::pointers(["/from_account", "/to_account"])
}

fn post_json(body: impl Into<Body>) -> Request<Body> {
    Request::post("/transfers")
        .header(CONTENT_TYPE, "application/json")
        .body(body.into())
        .unwrap()
}

fn transfer_body(from: &str, to: &str) -> String {
    format!(r#"{{"from_account":"{from}","to_account":"{to}","amount":5}}"#)
}

/// `app`'s answer to a JSON POST of `body`.
async fn send_body(app: &Router, body: Body) -> Response {
    app.clone().oneshot(post_json(body)).await.unwrap()
}

fn spawn_call(app: &Router, request: Request<Body>) -> JoinHandle<Response> {
    let app = app.clone();
    tokio::spawn(async move { app.oneshot(request).await.unwrap() })
}

async fn answered(call: JoinHandle<Response>, why: &str) -> (StatusCode, String) {
    let response = tokio::time::timeout(SLACK, call)
        .await
        .unwrap_or_else(|_| panic!("no answer within {SLACK:?}: {why}"))
        .unwrap();
    text(response).await
}

async fn text(response: Response) -> (StatusCode, String) {
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

async fn entered(reports: &mut mpsc::UnboundedReceiver<Entered>, why: &str) -> Entered {
    tokio::time::timeout(SLACK, reports.recv())
        .await
        .unwrap_or_else(|_| panic!("no handler started within {SLACK:?}: {why}"))
        .expect("the desk is open")
}

async fn is_locked(locks: &LockClient, name: &str) -> bool {
    locks.lock(name).unwrap().is_locked().await.unwrap()
}

/// Whether the lock `name` is gone from Redis within the bound (a dropped guard releases it
/// in the background).
async fn released(server: &RedisServer, name: &str) -> bool {
    let hash = format!("lock:{{{name}}}");
    eventually(SLACK, || server.cmd::<i64>(&["EXISTS", &hash]) == 0).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_holds_both_accounts_while_its_handler_runs_on_its_intact_body() {
    let server = RedisServer::start();
    let (locks, other) = (client(&server).await, client(&server).await);
    let (desk, mut reports) = Desk::new(0);
    let keys = JsonKeys::pointers(["/from_account", "/to_account"]);
    let app = Router::new()
        .route("/transfers", post(transfer))
        .with_state(desk.clone())
        .layer(LockLayer::new(locks, keys.clone())) // takes the keys found outside it
        .layer(keys.layer()); // added last, runs first: reads the body (64 KiB at most)

    let call = spawn_call(&app, post_json(TRANSFER));
    let started = entered(&mut reports, "the transfer runs").await;
    let expected: Transfer = serde_json::from_str(TRANSFER).unwrap();
    assert_eq!(started.transfer, expected);
    assert_eq!(started.keys, ["a1", "a2"]);
    for account in ["a1", "a2"] {
        assert!(
            is_locked(&other, account).await,
            "{account} is locked in Redis while the handler runs"
        );
    }
    assert!(!is_locked(&other, "a3").await, "no other account is");

    desk.gate.add_permits(1);
    assert_eq!(
        answered(call, "the gate is open").await,
        (StatusCode::OK, TRANSFER.to_owned()),
        "the handler got the body byte for byte"
    );
    for account in ["a1", "a2"] {
        assert!(
            released(&server, account).await,
            "{account} is released after the response"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opposite_transfers_take_the_accounts_in_one_order_and_never_deadlock() {
    let server = RedisServer::start();
    let (desk, mut reports) = Desk::new(OPEN);
    let keys = accounts();
    let mut instances = Vec::new();
    for _ in 0..2 {
        let locks = client(&server).await;
        instances.push(transfers(&desk, LockLayer::new(locks, keys.clone()), &keys));
    }
    let calls: Vec<_> = (0..20)
        .map(|i| {
            let (from, to) = if i % 2 == 0 {
                ("a1", "a2")
            } else {
                ("a2", "a1")
            };
            spawn_call(&instances[i % 2], post_json(transfer_body(from, to)))
        })
        .collect();
    for call in calls {
        let (status, body) = answered(call, "opposite transfers deadlock").await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    for _ in 0..20 {
        let started = reports.try_recv().expect("every handler reported");
        assert_eq!(
            started.keys,
            ["a1", "a2"],
            "both directions take the accounts in one order"
        );
    }
    assert_eq!(desk.most("a1"), 1, "one transfer at a time on a1");
    assert_eq!(desk.most("a2"), 1, "one transfer at a time on a2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_lease_of_either_account_cancels_the_handler() {
    let server = RedisServer::start();
    // Renewed every 250 ms, so a lost lock is found within one renewal; a lease of 1.5 s
    // outlives five late renewals on a busy machine, so only the operator takes it away.
    let locks = LockClient::builder(&server.url())
        .watchdog_lease(Duration::from_millis(1500))
        .renew_interval(Duration::from_millis(250))
        .lease_limit(Duration::from_secs(5))
        .command_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    let operator = client(&server).await;
    let (desk, mut reports) = Desk::new(0);
    let keys = accounts();
    let app = transfers(&desk, LockLayer::new(locks, keys.clone()), &keys);

    for (lost, kept) in [("a1", "a2"), ("a2", "a1")] {
        let call = spawn_call(&app, post_json(TRANSFER));
        entered(&mut reports, "the transfer runs").await;
        assert!(
            operator.lock(lost).unwrap().force_unlock().await.unwrap(),
            "{lost} was held, and is taken away"
        );
        let (status, body) = answered(call, "the lost lease cancels the handler").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert_eq!(
            body,
            "lock lost while the request ran for [a1, a2]; retry\n"
        );
        assert_eq!(desk.now("a1"), 0, "the handler's future was dropped");
        assert_eq!(desk.finished.load(Ordering::SeqCst), 0, "it never finished");
        assert!(
            released(&server, kept).await,
            "{kept}, still held, is released with the handler"
        );
    }
}

/// A streamed body of `chunks` chunks of `size` bytes with no length, counting the chunks
/// read.
fn streamed(chunks: usize, size: usize, read: Arc<AtomicUsize>) -> Body {
    let stream = futures_util::stream::iter(0..chunks).map(move |_| {
        read.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Infallible>(Bytes::from(vec![b' '; size]))
    });
    Body::from_stream(stream)
}

#[tokio::test]
async fn a_body_over_the_bound_is_413_whether_declared_or_streamed() {
    let logs = CapturedLogs::start();
    let server = RedisServer::start();
    let locks = client(&server).await;
    let (desk, _reports) = Desk::new(OPEN);
    let keys = accounts().max_body(256);
    let app = transfers(&desk, LockLayer::new(locks, keys.clone()), &keys);

    // Declared: refused before a byte is read.
    let read = Arc::new(AtomicUsize::new(0));
    let declared = Request::post("/transfers")
        .header(CONTENT_LENGTH, "1000")
        .body(streamed(10, 100, read.clone()))
        .unwrap();
    assert_eq!(
        text(app.clone().oneshot(declared).await.unwrap()).await,
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            "request body too large: 1000 bytes, over the limit of 256\n".to_owned()
        )
    );
    assert_eq!(read.load(Ordering::SeqCst), 0, "not a chunk was read");

    // Streamed with no length: read until it passes the bound, and no further.
    let read = Arc::new(AtomicUsize::new(0));
    let unbounded = post_json(streamed(10, 100, read.clone()));
    assert_eq!(
        text(app.clone().oneshot(unbounded).await.unwrap()).await,
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            "request body too large: over the limit of 256 bytes\n".to_owned()
        )
    );
    assert_eq!(
        read.load(Ordering::SeqCst),
        3,
        "read up to the chunk past 256 bytes"
    );

    // A body of exactly the bound passes.
    let mut exact = transfer_body("a1", "a2");
    exact.insert_str(1, &" ".repeat(256 - exact.len()));
    assert_eq!(exact.len(), 256);
    let (status, body) = text(app.clone().oneshot(post_json(exact.clone())).await.unwrap()).await;
    assert_eq!((status, body), (StatusCode::OK, exact));

    assert_eq!(desk.finished.load(Ordering::SeqCst), 1, "only that one ran");
    let logged = logs.lines_with("request rejected");
    assert!(
        logged.iter().any(|line| line.contains("body_too_large")),
        "the layer logs its answers: {logged:#?}"
    );
}

#[tokio::test]
async fn a_body_without_its_keys_or_not_json_is_400_and_never_reaches_redis() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let (desk, _reports) = Desk::new(OPEN);
    let keys = accounts();
    let app = transfers(&desk, LockLayer::new(locks.clone(), keys.clone()), &keys);
    let send = |body: &'static str| app.clone().oneshot(post_json(body));

    for (body, answer) in [
        (
            r#"{"from_account":"a1","amount":5}"#,
            "missing lock key: the body has no /to_account\n",
        ),
        (
            "",
            "missing lock key: the body is empty; it must be JSON with /from_account, /to_account\n",
        ),
        (
            r#"{"from_account":"a1","to_account":["a2"]}"#,
            "invalid lock key: /to_account is an array, not a string or an integer\n",
        ),
        (
            "<transfer from=\"a1\"/>",
            "invalid lock key: the body is not JSON (expected value at line 1 column 1)\n",
        ),
    ] {
        assert_eq!(
            text(send(body).await.unwrap()).await,
            (StatusCode::BAD_REQUEST, answer.to_owned()),
            "{body}"
        );
    }
    // A body that fails while it is read (the client went away) is no bad key: its own kind.
    let broken = futures_util::stream::iter([
        Ok(Bytes::from_static(b"{\"from_account\"")),
        Err(std::io::Error::other("connection reset")),
    ]);
    let response = send_body(&app, Body::from_stream(broken)).await;
    assert_eq!(
        text(response).await,
        (
            StatusCode::BAD_REQUEST,
            "request body could not be read\n".to_owned()
        )
    );
    assert_eq!(desk.finished.load(Ordering::SeqCst), 0, "no handler ran");
    assert_eq!(server.keys_besides_epoch(), 0, "no key reached redis");

    // The answers go through the layer's hook, with the keys found so far.
    let keyed = |rejection: &Rejection| {
        let mut response: Response = rejection.problem_json_response();
        let found = rejection.keys().join(",");
        response
            .headers_mut()
            .insert("x-keys", found.parse().unwrap());
        response
    };
    let hooked = Router::new()
        .route("/transfers", post(transfer))
        .with_state(desk.clone())
        .layer(LockLayer::new(locks.clone(), keys.clone()))
        .layer(keys.layer().rejection(keyed));
    let response = hooked
        .oneshot(post_json(r#"{"from_account":"a1"}"#))
        .await
        .unwrap();
    assert_eq!(response.headers()["x-keys"], "a1");
    assert_eq!(response.headers()[CONTENT_TYPE], "application/problem+json");
    let (status, body) = text(response).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains(r#""kind":"missing_key""#), "{body}");
}

/// The keys the request holds with their fencing tokens (`a1=7,a2=3`), or `unlocked`.
async fn held(lock: Option<LockContext>) -> String {
    let Some(lock) = lock else {
        return "unlocked".to_owned();
    };
    let keys: Vec<String> = lock
        .keys()
        .map(|key| format!("{key}={}", lock.fencing_token_of(key).unwrap()))
        .collect();
    keys.join(",")
}

/// The keys of `held`'s answer, without their tokens.
fn names(held: &str) -> Vec<&str> {
    held.split(',')
        .map(|pair| pair.split('=').next().unwrap())
        .collect()
}

fn orders(locks: &LockClient, keys: &JsonKeys) -> Router {
    Router::new()
        .route("/orders", post(held))
        .layer(LockLayer::new(locks.clone(), keys.clone()))
        .layer(keys.layer())
}

fn post_order(body: &'static str) -> Request<Body> {
    Request::post("/orders").body(Body::from(body)).unwrap()
}

#[tokio::test]
async fn integers_are_keys_in_decimal_and_a_closure_finds_any_keys() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let by_pointer = orders(&locks, &JsonKeys::pointers(["/customer", "/order_id"]));
    let (status, keys) = text(
        by_pointer
            .oneshot(post_order(r#"{"customer":"c1","order_id":42}"#))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{keys}");
    let mut found = names(&keys);
    found.sort_unstable();
    assert_eq!(found, ["42", "c1"]);

    // Every SKU of an order's lines; an empty body is `null`: no key, and the lock layer
    // runs the request unlocked (its default for keyless requests).
    let skus = JsonKeys::with(|order: &serde_json::Value| {
        if order.is_null() {
            return Ok(Keys::none());
        }
        let lines = order["lines"]
            .as_array()
            .ok_or(InvalidKey::new("an order has lines"))?;
        let skus = lines.iter().filter_map(|line| line["sku"].as_str());
        Ok(skus.map(str::to_owned).collect::<Vec<_>>().into())
    });
    let by_closure = orders(&locks, &skus);
    let send = |body| by_closure.clone().oneshot(post_order(body));
    let (status, keys) = text(
        send(r#"{"lines":[{"sku":"x1"},{"sku":"y2"}]}"#)
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((status, names(&keys)), (StatusCode::OK, vec!["x1", "y2"]));
    assert_eq!(
        text(send(r#"{"id":1}"#).await.unwrap()).await,
        (
            StatusCode::BAD_REQUEST,
            "invalid lock key: an order has lines\n".to_owned()
        )
    );
    assert_eq!(
        text(send("").await.unwrap()).await,
        (StatusCode::OK, "unlocked".to_owned())
    );
}

#[tokio::test]
async fn the_lock_context_has_the_fencing_token_of_each_account() {
    let server = RedisServer::start();
    let (locks, other) = (client(&server).await, client(&server).await);
    let (desk, mut reports) = Desk::new(2);
    let keys = accounts();
    let app = transfers(&desk, LockLayer::new(locks, keys.clone()), &keys);

    let mut tokens = Vec::new();
    for body in [transfer_body("a1", "a2"), transfer_body("a2", "a1")] {
        let (status, _) = text(app.clone().oneshot(post_json(body)).await.unwrap()).await;
        assert_eq!(status, StatusCode::OK);
        let started = entered(&mut reports, "the transfer ran").await;
        let [from, to] = started
            .tokens
            .map(|token| token.expect("a token per account"));
        // By account name, whichever way the money went.
        tokens.push(if started.transfer.from_account == "a1" {
            (from, to)
        } else {
            (to, from)
        });
    }
    let [(a1_first, a2_first), (a1_then, a2_then)] = tokens[..] else {
        unreachable!()
    };
    assert!(a1_then > a1_first, "a1's token grows: {tokens:?}");
    assert!(a2_then > a2_first, "a2's token grows: {tokens:?}");
    for (account, last) in [("a1", a1_then), ("a2", a2_then)] {
        assert!(released(&server, account).await);
        let next = other.lock(account).unwrap().acquire().await.unwrap();
        assert!(
            next.fencing_token() > last,
            "the next holder of {account} gets a greater token than the handler had"
        );
        next.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_of_two_per_account_makes_a_third_transfer_wait() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let (desk, mut reports) = Desk::new(0);
    let keys = accounts();
    let app = transfers(&desk, LockLayer::new(locks, keys.clone()).limit(2), &keys);

    let running = [
        spawn_call(&app, post_json(transfer_body("a1", "a2"))),
        spawn_call(&app, post_json(transfer_body("a1", "a3"))),
    ];
    for _ in 0..2 {
        entered(&mut reports, "two transfers from a1 run at once").await;
    }
    assert_eq!(desk.now("a1"), 2);
    let waiting = spawn_call(&app, post_json(transfer_body("a1", "a4")));
    let queue = "lock:{a1}:semaphore:queue";
    assert!(
        eventually(SLACK, || server.cmd::<i64>(&["ZCARD", queue]) == 1).await,
        "the third transfer from a1 waits for a permit"
    );
    assert!(reports.try_recv().is_err(), "and has not started");
    assert!(!waiting.is_finished());

    desk.gate.add_permits(1);
    let third = entered(&mut reports, "a permit of a1 came free").await;
    assert_eq!(third.transfer.to_account, "a4");
    desk.gate.add_permits(2);
    for call in running.into_iter().chain([waiting]) {
        assert_eq!(answered(call, "the gate is open").await.0, StatusCode::OK);
    }
    assert_eq!(desk.most("a1"), 2, "never more than two on a1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_and_read_write_locks_take_the_keys_of_the_body_too() {
    let server = RedisServer::start();
    let keys = accounts();
    for sharing in [Sharing::Fair, Sharing::read_write()] {
        let (desk, mut reports) = Desk::new(OPEN);
        let mut instances = Vec::new();
        for _ in 0..2 {
            let locks = client(&server).await;
            let layer = LockLayer::new(locks, keys.clone()).sharing(sharing.clone());
            instances.push(transfers(&desk, layer, &keys));
        }
        let calls: Vec<_> = (0..10)
            .map(|i| {
                let (from, to) = if i % 2 == 0 {
                    ("a1", "a2")
                } else {
                    ("a2", "a1")
                };
                spawn_call(&instances[i % 2], post_json(transfer_body(from, to)))
            })
            .collect();
        for call in calls {
            let (status, body) = answered(call, "transfers under each sharing").await;
            assert_eq!(status, StatusCode::OK, "{sharing:?}: {body}");
        }
        for _ in 0..10 {
            let started = reports.try_recv().expect("every handler reported");
            assert_eq!(started.keys, ["a1", "a2"], "{sharing:?}");
        }
        // POST writes under read-write sharing: alone, as under a fair lock.
        assert_eq!(desk.most("a1"), 1, "{sharing:?}");
        assert_eq!(desk.most("a2"), 1, "{sharing:?}");
    }

    // Under read-write sharing a GET reads: two GETs of one account run together.
    let (desk, mut reports) = Desk::new(0);
    let layer = LockLayer::new(client(&server).await, keys.clone()).sharing(Sharing::read_write());
    let app = transfers(&desk, layer, &keys);
    let get = || {
        Request::get("/transfers")
            .body(Body::from(TRANSFER))
            .unwrap()
    };
    let reads = [spawn_call(&app, get()), spawn_call(&app, get())];
    for _ in 0..2 {
        entered(&mut reports, "two reads of a1 and a2 share the locks").await;
    }
    assert_eq!(desk.now("a1"), 2);
    desk.gate.add_permits(2);
    for call in reads {
        assert_eq!(answered(call, "the gate is open").await.0, StatusCode::OK);
    }
}

#[tokio::test]
async fn a_body_layer_inside_the_lock_layer_is_named_in_the_answer() {
    let logs = CapturedLogs::start();
    let server = RedisServer::start();
    let locks = client(&server).await;
    let keys = accounts();
    // Wrong: the lock layer is added last, so it runs first and finds no keys yet.
    let app = Router::new()
        .route("/orders", post(held))
        .layer(keys.layer())
        .layer(LockLayer::new(locks.clone(), keys.clone()));
    let (status, body) = text(app.oneshot(post_order(TRANSFER)).await.unwrap()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body.contains("the JsonKeys body layer did not run before the lock layer"),
        "{body}"
    );
    assert_eq!(logs.lines_with("JsonKeys found no keys").len(), 1);

    // Two `JsonKeys` built apart are two extractors: the lock layer's finds none of the
    // other's keys.
    let apart = Router::new()
        .route("/orders", post(held))
        .layer(LockLayer::new(locks, accounts()))
        .layer(keys.layer());
    let (status, _) = text(apart.oneshot(post_order(TRANSFER)).await.unwrap()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(server.keys_besides_epoch(), 0, "no key reached redis");
}

/// A transfer handler that counts its runs and answers the run and the accounts it held.
async fn counted_transfer(
    State(runs): State<Arc<AtomicUsize>>,
    lock: LockContext,
    body: Bytes,
) -> (StatusCode, String) {
    let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
    let keys = lock.keys().collect::<Vec<_>>().join(",");
    let body = String::from_utf8_lossy(&body).into_owned();
    (
        StatusCode::CREATED,
        format!("run {run} held {keys} for {body}"),
    )
}

#[tokio::test]
async fn the_body_layer_the_idempotency_layer_and_the_lock_layer_stack_on_one_route() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let keys = JsonKeys::pointers(["/from_account", "/to_account"]);
    let runs = Arc::new(AtomicUsize::new(0));
    // Outermost first: the body is read for its keys, the duplicate answered, then the
    // accounts locked.
    let app = Router::new()
        .route("/transfers", post(counted_transfer))
        .with_state(runs.clone())
        .layer(LockLayer::new(locks.clone(), keys.clone()))
        .layer(IdempotencyLayer::new(locks.clone()).scope(HeaderKey::new("x-tenant-id")))
        .layer(keys.layer());
    let send = |body: &'static str| {
        let app = app.clone();
        async move {
            let request = Request::post("/transfers")
                .header("x-tenant-id", "acme")
                .header("idempotency-key", "t-1")
                .body(Body::from(body))
                .unwrap();
            let response = tokio::time::timeout(SLACK, app.oneshot(request))
                .await
                .expect("an answer in time")
                .unwrap();
            let replayed = response.headers().contains_key("idempotent-replayed");
            let status = response.status();
            let body = axum::body::to_bytes(response.into_body(), 1 << 16)
                .await
                .unwrap();
            (status, replayed, String::from_utf8(body.to_vec()).unwrap())
        }
    };
    let first = send(TRANSFER).await;
    assert_eq!(
        first,
        (
            StatusCode::CREATED,
            false,
            format!("run 1 held a1,a2 for {TRANSFER}")
        )
    );
    let again = send(TRANSFER).await;
    assert_eq!((again.0, again.1, &again.2), (first.0, true, &first.2));
    let reused = send(r#"{"from_account":"a1","to_account":"a3","amount":5}"#).await;
    assert_eq!(reused.0, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
