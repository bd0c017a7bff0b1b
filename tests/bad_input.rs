//! Bad and hostile input against a real redis-server: every name is either refused with a
//! typed error (a 400 / `INVALID_ARGUMENT` through the layer) or locks exactly its own
//! escaped keys; names shaped like internal keys are locks of their own; floods of keys
//! leave no entries behind, locally or in Redis.

mod support;

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::stream;
use http::{HeaderValue, Request, Response, StatusCode};
use support::{RedisServer, client};
use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceExt, service_fn};
use tower_redis_lock::layer::{PathSegmentKey, Rejection, RejectionKind};
use tower_redis_lock::{
    DEFAULT_PREFIX, ErrorKind, HeaderKey, KeyExtractor, LockClient, LockContext, LockGuard,
    LockKeys, LockLayer, MAX_NAME_LEN,
};

/// Bound for waits that normally take milliseconds; generous because CI machines are shared.
const SLACK: Duration = Duration::from_secs(10);
/// Bound for the floods of thousands of locks below (a debug build on two shared cores).
const FLOOD_BOUND: Duration = Duration::from_secs(120);
/// Acquisitions in flight at once in the floods.
const IN_FLIGHT: usize = 64;

type Http = BoxCloneSyncService<Request<String>, Response<String>, Infallible>;

/// Every key under the default prefix, sorted.
/// The keys of locks in Redis (the server's epoch key, its marker and the token counter aside,
/// which every client writes on first use).
fn lock_keys(server: &RedisServer) -> BTreeSet<String> {
    server
        .cmd::<Vec<String>>(&["KEYS", "lock:*"])
        .into_iter()
        .filter(|key| !key.starts_with("lock:epoch") && key != "lock:tokens")
        .collect()
}

/// Whether `name` is held by someone else: `client` cannot take it now.
async fn is_taken(client: &LockClient, name: &str) -> bool {
    client
        .lock(name)
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .is_none()
}

fn set<const N: usize>(keys: [&str; N]) -> BTreeSet<String> {
    keys.into_iter().map(str::to_owned).collect()
}

/// Names no lock may have: empty, or over `MAX_NAME_LEN` bytes (multi-byte ones included).
fn invalid_names() -> Vec<String> {
    let euro_over = "€".repeat(MAX_NAME_LEN / 3 + 1);
    assert_eq!(euro_over.len(), MAX_NAME_LEN + 1);
    vec![
        String::new(),
        "x".repeat(MAX_NAME_LEN + 1),
        euro_over,
        "é".repeat(MAX_NAME_LEN / 2 + 1),
    ]
}

/// Names full of escaping's special characters, and the hash each must lock, spelled out.
const TRICKY: [(&str, &str); 9] = [
    ("{", "lock:{%7B}"),
    ("}", "lock:{%7D}"),
    ("%7B", "lock:{%257B}"),
    ("%", "lock:{%25}"),
    ("%25", "lock:{%2525}"),
    ("}{", "lock:{%7D%7B}"),
    ("a{b}c", "lock:{a%7Bb%7Dc}"),
    ("{}", "lock:{%7B%7D}"),
    ("a%7Db", "lock:{a%257Db}"),
];

/// Names at the limit exactly: valid, however many bytes a character takes.
fn names_at_the_limit() -> Vec<String> {
    let euro_and_e = format!("{}é", "€".repeat(MAX_NAME_LEN / 3));
    assert_eq!(euro_and_e.len(), MAX_NAME_LEN);
    vec![
        "x".repeat(MAX_NAME_LEN),
        euro_and_e,
        "{".repeat(MAX_NAME_LEN),
    ]
}

#[tokio::test]
async fn invalid_names_are_typed_errors_everywhere_in_the_client_api() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let () = server.cmd(&["CONFIG", "RESETSTAT"]);
    for name in invalid_names() {
        let err = locks.lock(&name).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidName, "{} bytes", name.len());
        let err = LockKeys::new(DEFAULT_PREFIX, &name).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidName);
        // One bad name among good ones: nothing is taken, not even the good ones.
        let names = ["good-before", name.as_str(), "good-after"];
        let err = locks
            .acquire_all(&names, Default::default())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidName);
    }
    assert_eq!(support::script_calls(&server), 0);
    assert_eq!(lock_keys(&server), BTreeSet::new());
    assert_eq!(locks.local_keys(), 0);
}

#[tokio::test]
async fn each_tricky_name_locks_exactly_its_own_escaped_keys() {
    let server = RedisServer::start();
    let (locks, rival) = (client(&server).await, client(&server).await);
    for (name, hash) in TRICKY {
        // Taken free, its tokens come from the clock: the hash is its only key.
        let guard = locks.lock(name).unwrap().acquire().await.unwrap();
        assert_eq!(lock_keys(&server), set([hash]), "holding {name:?}");
        let holders: Vec<String> = server.cmd(&["HKEYS", hash]);
        assert_eq!(holders, [guard.owner_id()]);
        assert!(is_taken(&rival, name).await);
        guard.release().await.unwrap();
        assert_eq!(lock_keys(&server), set([]), "released {name:?}");
    }
    for name in names_at_the_limit() {
        let guard = locks.lock(&name).unwrap().acquire().await.unwrap();
        let keys = locks.lock(&name).unwrap().keys().clone();
        assert_eq!(lock_keys(&server), set([keys.hash()]));
        guard.release().await.unwrap();
    }
}

#[tokio::test]
async fn tricky_names_held_at_once_are_all_different_locks() {
    let server = RedisServer::start();
    let (locks, rival) = (client(&server).await, client(&server).await);
    let mut guards = Vec::new();
    for (name, _) in TRICKY {
        // try_acquire: a collision with a lock taken earlier in this loop would show as None.
        let guard = locks.lock(name).unwrap().try_acquire().await.unwrap();
        guards.push(guard.unwrap_or_else(|| panic!("{name:?} collided with another name")));
    }
    let mut expected = BTreeSet::new();
    for (_, hash) in TRICKY {
        expected.insert(hash.to_owned());
    }
    assert_eq!(lock_keys(&server), expected);
    for (name, _) in TRICKY {
        assert!(is_taken(&rival, name).await);
    }
    for guard in guards {
        guard.release().await.unwrap();
    }
    assert_eq!(locks.local_keys(), 0);
}

/// Names spelled like the internal keys of the lock `x`, or like a wake channel.
fn crafted_names(wake_target: &LockClient) -> Vec<String> {
    let mut names: Vec<String> = [
        "x}:fence",
        "x}:released",
        "x}:queue",
        "x}:waiters",
        "x}",
        "x:fence",
        "x:queue",
        "{x}",
        "wake:abc",
    ]
    .map(str::to_owned)
    .into();
    names.push(format!("wake:{}", wake_target.instance_id()));
    names.push(format!("}}:wake:{}", wake_target.instance_id()));
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_shaped_like_internal_keys_are_locks_of_their_own() {
    let server = RedisServer::start();
    let (a, b) = (client(&server).await, client(&server).await);
    // A token counter past the clock (year 2255, in µs), as a clock that stepped back can
    // leave: `x` reserves its block past it. And a block granted earlier to another owner,
    // still in `x`'s grant key: a key of `x` a crafted name could write into.
    let () = server.cmd(&["SET", "lock:tokens", "9000000000000000"]);
    let () = server.cmd(&["SET", "lock:{x}:fence", "8999999999999999 earlier:1"]);
    let plain = a.lock("x").unwrap().acquire().await.unwrap();
    let token_of_x = plain.fencing_token();
    let fence_of_x: String = server.cmd(&["GET", "lock:{x}:fence"]);
    assert_eq!(plain.fencing_token(), 9_000_000_000_000_001);

    let crafted = crafted_names(&a);
    let mut guards = Vec::new();
    for name in &crafted {
        let guard = b.lock(name).unwrap().try_acquire().await.unwrap();
        guards.push(guard.unwrap_or_else(|| panic!("{name:?} collided with a held lock")));
    }
    // Every crafted name has its own hash, and the internal keys of `x` are what they were.
    let mut expected = set(["lock:{x}", "lock:{x}:fence"]);
    for name in &crafted {
        let keys = b.lock(name).unwrap().keys().clone();
        assert_ne!(keys.hash(), "lock:{x}:fence");
        expected.insert(keys.hash().to_owned());
    }
    assert_eq!(lock_keys(&server), expected);
    assert_eq!(
        server.cmd::<String>(&["TYPE", "lock:{x}:fence"]),
        "string",
        "no crafted name wrote into the grant key of x"
    );
    assert_eq!(server.cmd::<String>(&["GET", "lock:{x}:fence"]), fence_of_x);
    assert_eq!(
        server.cmd::<Vec<String>>(&["HKEYS", "lock:{x}"]),
        [plain.owner_id()]
    );

    // Releasing the crafted locks leaves `x` held, and the other way round.
    for guard in guards.drain(..3) {
        guard.release().await.unwrap();
    }
    assert!(plain.is_held());
    assert!(is_taken(&b, "x").await);
    plain.release().await.unwrap();
    for name in &crafted[3..] {
        assert!(
            is_taken(&a, name).await,
            "{name:?} is still held after x was released"
        );
    }
    assert_eq!(server.cmd::<String>(&["GET", "lock:{x}:fence"]), fence_of_x);
    for guard in guards {
        guard.release().await.unwrap();
    }
    let next = a.lock("x").unwrap().try_acquire().await.unwrap().unwrap();
    assert!(next.fencing_token() > token_of_x);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crafted_names_do_not_disturb_a_queue_or_a_wake_up() {
    let server = RedisServer::start();
    let holder = client(&server).await;
    // Re-polls an hour apart: only the wake message can hand this waiter the lock in time.
    let waiter_client = LockClient::builder(&server.url())
        .repoll_interval(Duration::from_secs(3600))
        .build()
        .await
        .unwrap();
    let meddler = client(&server).await;

    let held = holder.lock("x").unwrap().acquire().await.unwrap();
    let waiting = {
        let lock = waiter_client.lock("x").unwrap();
        tokio::spawn(async move { lock.acquire().await })
    };
    assert!(support::eventually(SLACK, || support::queued(&server, "x").len() == 1).await);
    let queue_before = support::queued(&server, "x");
    let waiters_before: Vec<String> = server.cmd(&["HKEYS", "lock:{x}:waiters"]);

    // Take and release, with a third client, every crafted name, those naming the waiter's
    // own wake channel included.
    for name in crafted_names(&waiter_client) {
        let guard = meddler.lock(&name).unwrap().try_acquire().await.unwrap();
        guard
            .expect("a crafted name is free")
            .release()
            .await
            .unwrap();
    }
    assert_eq!(support::queued(&server, "x"), queue_before);
    assert_eq!(
        server.cmd::<Vec<String>>(&["HKEYS", "lock:{x}:waiters"]),
        waiters_before
    );
    assert_eq!(
        support::subscribers(&server, &support::wake_channel(&waiter_client)),
        1
    );

    held.release().await.unwrap();
    let granted = tokio::time::timeout(SLACK, waiting)
        .await
        .expect("the wake message reached the waiter")
        .unwrap()
        .unwrap();
    assert!(granted.is_held());
}

/// A handler that counts its runs and answers with the lock keys Redis holds while it runs.
fn keys_seen_handler(server: &RedisServer, runs: Arc<AtomicUsize>) -> Http {
    let url = server.url();
    BoxCloneSyncService::new(service_fn(move |request: Request<String>| {
        let (url, runs) = (url.clone(), runs.clone());
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            assert!(request.extensions().get::<LockContext>().is_some());
            let mut conn = redis::Client::open(url)
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            let mut keys: Vec<String> = redis::cmd("KEYS")
                .arg("lock:{*")
                .query_async(&mut conn)
                .await
                .unwrap();
            keys.sort();
            Ok(Response::new(keys.join(" ")))
        }
    }))
}

fn header_request(value: HeaderValue) -> Request<String> {
    let mut request = Request::new(String::new());
    request.headers_mut().insert("x-tenant-id", value);
    request
}

fn grpc(mut request: Request<String>) -> Request<String> {
    request
        .headers_mut()
        .insert("content-type", HeaderValue::from_static("application/grpc"));
    request
}

async fn send(service: &Http, request: Request<String>) -> Response<String> {
    service.clone().oneshot(request).await.unwrap()
}

/// Sends `request` as HTTP and as gRPC; both must be refused as invalid arguments.
async fn assert_refused(service: &Http, request: impl Fn() -> Request<String>, what: &str) {
    let http = send(service, request()).await;
    assert_eq!(http.status(), StatusCode::BAD_REQUEST, "{what}");
    let grpc = send(service, grpc(request())).await;
    assert_eq!(
        grpc.status(),
        StatusCode::OK,
        "{what}: trailers-only gRPC answer"
    );
    assert_eq!(
        grpc.headers()["grpc-status"],
        "3",
        "{what}: INVALID_ARGUMENT"
    );
    assert_eq!(grpc.headers()["content-type"], "application/grpc");
}

/// A rejection hook that records why each request was refused.
fn recording_rejection(
    kinds: Arc<Mutex<Vec<RejectionKind>>>,
) -> impl Fn(&Rejection) -> Response<String> + Clone {
    move |rejection: &Rejection| {
        kinds.lock().unwrap().push(rejection.kind());
        rejection.default_response()
    }
}

#[tokio::test]
async fn unusable_header_values_are_400_or_invalid_argument_and_never_reach_redis() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let kinds = Arc::new(Mutex::new(Vec::new()));
    let layer = LockLayer::new(locks.clone(), HeaderKey::new("x-tenant-id"))
        .rejection(recording_rejection(kinds.clone()));
    let service: Http =
        BoxCloneSyncService::new(layer.layer(keys_seen_handler(&server, runs.clone())));
    let () = server.cmd(&["CONFIG", "RESETSTAT"]);

    let non_utf8 = || header_request(HeaderValue::from_bytes(&[0xff, 0xfe]).unwrap());
    assert_refused(&service, non_utf8, "a non-UTF-8 header").await;
    let utf8 = || header_request(HeaderValue::from_bytes("café".as_bytes()).unwrap());
    assert_refused(&service, utf8, "a UTF-8 (not visible ASCII) header").await;
    let just_over =
        || header_request(HeaderValue::from_str(&"k".repeat(MAX_NAME_LEN + 1)).unwrap());
    assert_refused(&service, just_over, "a header one byte over the limit").await;
    let huge = || header_request(HeaderValue::from_str(&"k".repeat(64 * 1024)).unwrap());
    assert_refused(&service, huge, "a 64 KiB header").await;
    let empty = || header_request(HeaderValue::from_static(""));
    assert_refused(&service, empty, "an empty header").await;
    // Sent twice: which tenant would the handler act on? Neither is locked.
    let twice = || {
        let mut request = header_request(HeaderValue::from_static("acme"));
        let headers = request.headers_mut();
        headers.append("x-tenant-id", HeaderValue::from_static("globex"));
        request
    };
    assert_refused(&service, twice, "a key header sent twice").await;

    assert_eq!(runs.load(Ordering::SeqCst), 0, "no handler ran");
    let kinds = kinds.lock().unwrap().clone();
    assert_eq!(kinds, vec![RejectionKind::InvalidKey; 12]);
    assert_eq!(support::script_calls(&server), 0);
    assert_eq!(support::command_calls(&server, "eval"), 0);
    assert_eq!(server.keys_besides_epoch(), 0);
    assert_eq!(locks.local_keys(), 0);
}

#[tokio::test]
async fn an_empty_key_under_a_layer_prefix_is_400_not_a_lock_on_the_prefix() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = LockLayer::new(locks.clone(), HeaderKey::new("x-tenant-id")).key_prefix("orders:");
    let service: Http =
        BoxCloneSyncService::new(layer.layer(keys_seen_handler(&server, runs.clone())));
    let empty = || header_request(HeaderValue::from_static(""));
    assert_refused(&service, empty, "an empty key under a prefix").await;
    // Closures too: an empty key among good ones refuses the request.
    let with_empty = |_: &Request<String>| vec!["acme".to_owned(), String::new()];
    let closure: Http = BoxCloneSyncService::new(
        LockLayer::new(locks.clone(), with_empty)
            .key_prefix("orders:")
            .layer(keys_seen_handler(&server, runs.clone())),
    );
    assert_refused(
        &closure,
        || Request::new(String::new()),
        "an empty key in a list",
    )
    .await;
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(server.keys_besides_epoch(), 0);

    let good = send(&service, header_request(HeaderValue::from_static("acme"))).await;
    assert_eq!(good.status(), StatusCode::OK);
    assert_eq!(good.body(), "lock:{orders:acme}");
}

#[tokio::test]
async fn tricky_keys_through_the_layer_lock_exactly_their_own_keys() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = keys_seen_handler(&server, runs.clone());
    let header: Http = BoxCloneSyncService::new(
        LockLayer::new(locks.clone(), HeaderKey::new("x-tenant-id")).layer(handler.clone()),
    );
    for (name, hash) in TRICKY {
        let response = send(
            &header,
            header_request(HeaderValue::from_str(name).unwrap()),
        )
        .await;
        assert_eq!(response.status(), StatusCode::OK, "{name:?}");
        assert_eq!(response.into_body(), *hash, "{name:?}");
        // Released off the request path; the next request must see only its own keys.
        assert!(support::eventually(SLACK, || locks.local_keys() == 0).await);
    }
    assert_eq!(runs.load(Ordering::SeqCst), TRICKY.len());

    // Path keys are percent-decoded, as the router decodes the parameter the handler reads:
    // multi-byte names at the limit lock, one byte more is refused.
    let path: Http = BoxCloneSyncService::new(
        LockLayer::new(locks.clone(), PathSegmentKey::new(1)).layer(handler),
    );
    let encoded =
        |name: &str| -> String { name.bytes().map(|byte| format!("%{byte:02X}")).collect() };
    let path_request = |name: &str| {
        Request::builder()
            .uri(format!("/tenants/{}", encoded(name)))
            .body(String::new())
            .unwrap()
    };
    for name in names_at_the_limit() {
        let keys = LockKeys::new(DEFAULT_PREFIX, &name).unwrap();
        let response = send(&path, path_request(&name)).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.into_body(), keys.hash());
        assert!(support::eventually(SLACK, || locks.local_keys() == 0).await);
    }
    for name in invalid_names().into_iter().filter(|name| !name.is_empty()) {
        assert_refused(
            &path,
            || path_request(&name),
            "a decoded name over the limit",
        )
        .await;
    }
    assert_refused(
        &path,
        || path_request_raw("/tenants/%FF%FE"),
        "a non-UTF-8 segment",
    )
    .await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        TRICKY.len() + names_at_the_limit().len()
    );
    assert_eq!(lock_keys(&server).len(), 0, "every lock was released");
}

#[tokio::test]
async fn a_percent_encoded_path_key_is_the_lock_of_its_decoded_name() {
    let server = RedisServer::start();
    let (locks, other) = (client(&server).await, client(&server).await);
    let runs = Arc::new(AtomicUsize::new(0));
    let service: Http = BoxCloneSyncService::new(
        LockLayer::new(locks, PathSegmentKey::new(1))
            .wait_timeout(Duration::from_millis(300))
            .layer(keys_seen_handler(&server, runs.clone())),
    );
    // The router hands the handler `acme` for `/tenants/%61cme`: the request must wait for
    // the lock of `acme`, not slip past it under a lock of its own.
    let held = other.lock("acme").unwrap().acquire().await.unwrap();
    let encoded = send(&service, path_request_raw("/tenants/%61cme")).await;
    assert_eq!(encoded.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    held.release().await.unwrap();
    let response = send(&service, path_request_raw("/tenants/%61cme")).await;
    assert_eq!(response.status(), StatusCode::OK);
    // The lock of `acme`, with the counter the grant from the queue may have left.
    let body = response.into_body();
    assert!(
        body == "lock:{acme}" || body == "lock:{acme} lock:{acme}:fence",
        "{body}"
    );
}

fn path_request_raw(path: &str) -> Request<String> {
    Request::builder().uri(path).body(String::new()).unwrap()
}

#[tokio::test]
async fn ten_thousand_keys_in_one_request_are_400_quickly_and_never_reach_redis() {
    const QUICK: Duration = Duration::from_secs(1);
    let server = RedisServer::start();
    let locks = client(&server).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let kinds = Arc::new(Mutex::new(Vec::new()));
    // A list in one header is how a request names several keys: a closure splits it.
    let accounts = |request: &Request<String>| -> Vec<String> {
        request
            .headers()
            .get("x-accounts")
            .and_then(|value| value.to_str().ok())
            .map(|list| list.split(',').map(str::to_owned).collect())
            .unwrap_or_default()
    };
    let list: Http = BoxCloneSyncService::new(
        LockLayer::new(locks.clone(), accounts)
            .rejection(recording_rejection(kinds.clone()))
            .layer(keys_seen_handler(&server, runs.clone())),
    );
    let list_of = |count: usize| {
        let names: Vec<String> = (0..count).map(|i| format!("account-{i}")).collect();
        let mut request = Request::new(String::new());
        let value = HeaderValue::from_str(&names.join(",")).unwrap();
        request.headers_mut().insert("x-accounts", value);
        request
    };
    let () = server.cmd(&["CONFIG", "RESETSTAT"]);
    let started = Instant::now();
    assert_refused(&list, || list_of(10_000), "10,000 keys").await;
    let elapsed = started.elapsed();
    assert!(
        elapsed < QUICK,
        "two requests of 10,000 keys took {elapsed:?}"
    );
    // The same key 10,000 times counts as 10,000 too.
    let repeated = || {
        let mut request = Request::new(String::new());
        let value = HeaderValue::from_str(&vec!["acme"; 10_000].join(",")).unwrap();
        request.headers_mut().insert("x-accounts", value);
        request
    };
    assert_refused(&list, repeated, "one key 10,000 times").await;
    assert_refused(
        &list,
        || list_of(tower_redis_lock::layer::DEFAULT_MAX_KEYS + 1),
        "17 keys",
    )
    .await;
    // The header extractor takes one value: 10,000 copies of its header are refused.
    let header: Http = BoxCloneSyncService::new(
        LockLayer::new(locks.clone(), HeaderKey::new("x-tenant-id"))
            .rejection(recording_rejection(kinds.clone()))
            .layer(keys_seen_handler(&server, runs.clone())),
    );
    let copies = || {
        let mut request = Request::new(String::new());
        for i in 0..10_000 {
            let value = HeaderValue::from_str(&format!("tenant-{i}")).unwrap();
            request.headers_mut().append("x-tenant-id", value);
        }
        request
    };
    let started = Instant::now();
    assert_refused(&header, copies, "10,000 copies of the key header").await;
    let elapsed = started.elapsed();
    assert!(
        elapsed < QUICK,
        "two requests of 10,000 headers took {elapsed:?}"
    );

    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let kinds = kinds.lock().unwrap().clone();
    assert_eq!(kinds[..6], [RejectionKind::TooManyKeys; 6]);
    assert_eq!(kinds[6..], [RejectionKind::InvalidKey; 2]);
    assert_eq!(support::script_calls(&server), 0);
    assert_eq!(server.keys_besides_epoch(), 0);
    assert_eq!(locks.local_keys(), 0);

    // At the limit, every key is taken.
    let response = send(&list, list_of(tower_redis_lock::layer::DEFAULT_MAX_KEYS)).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.into_body().split(' ').count(),
        tower_redis_lock::layer::DEFAULT_MAX_KEYS
    );
}

/// The keys left in Redis after every lock of `names`, each granted from its queue, was
/// released: their last granted token blocks, which expire a lease after the grant. Nothing
/// else.
fn assert_only_fences_remain(server: &RedisServer, names: impl Iterator<Item = String>) {
    let expected: BTreeSet<String> = names.map(|name| format!("lock:{{{name}}}:fence")).collect();
    let left = lock_keys(server);
    let extra: Vec<_> = left.difference(&expected).take(5).collect();
    let missing: Vec<_> = expected.difference(&left).take(5).collect();
    assert!(
        extra.is_empty() && missing.is_empty(),
        "{} keys left; not fences: {extra:?}; fences missing: {missing:?}",
        left.len()
    );
    let sample = expected.iter().next().expect("some names");
    assert!(
        server.cmd::<i64>(&["TTL", sample]) > 0,
        "fences expire a lease after their last reservation"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_distinct_keys_through_the_client_leaves_no_entries() {
    const KEYS: usize = 20_000;
    let server = RedisServer::start();
    let locks = client(&server).await;
    let names = || (0..KEYS).map(|i| format!("flood-{i}"));
    let most_local = Arc::new(AtomicUsize::new(0));
    let flood = stream::iter(names())
        .map(|name| {
            let (locks, most_local) = (locks.clone(), most_local.clone());
            async move {
                let guard = locks.lock(&name).unwrap().acquire().await.unwrap();
                most_local.fetch_max(locks.local_keys(), Ordering::SeqCst);
                guard.release().await.unwrap();
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect::<Vec<()>>();
    tokio::time::timeout(FLOOD_BOUND, flood)
        .await
        .expect("the flood finished");
    assert!(most_local.load(Ordering::SeqCst) <= IN_FLIGHT);
    assert_eq!(locks.local_keys(), 0, "no local entry outlives its lock");
    assert_eq!(locks.queued_waiters(), 0);
    // Each lock was found free: its tokens came from the clock, and no key outlives it.
    assert_eq!(lock_keys(&server), set([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_distinct_keys_through_the_layer_leaves_no_entries() {
    const KEYS: usize = 20_000;
    let server = RedisServer::start();
    let locks = client(&server).await;
    let handler = service_fn(|request: Request<String>| async move {
        let context = request.extensions().get::<LockContext>().cloned().unwrap();
        Ok::<_, Infallible>(Response::new(context.keys().collect::<String>()))
    });
    let service: Http = BoxCloneSyncService::new(
        LockLayer::new(locks.clone(), HeaderKey::new("x-tenant-id")).layer(handler),
    );
    let names = || (0..KEYS).map(|i| format!("tenant-{i}"));
    let flood = stream::iter(names())
        .map(|name| {
            let service = service.clone();
            async move {
                let value = HeaderValue::from_str(&name).unwrap();
                let response = send(&service, header_request(value)).await;
                assert_eq!(response.status(), StatusCode::OK);
                assert_eq!(response.into_body(), name);
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect::<Vec<()>>();
    tokio::time::timeout(FLOOD_BOUND, flood)
        .await
        .expect("the flood finished");
    // The last releases run in the background after their responses.
    assert!(
        support::eventually(SLACK, || locks.local_keys() == 0).await,
        "{} local entries left",
        locks.local_keys()
    );
    // Each lock was found free: its tokens came from the clock, and no key outlives it.
    assert_eq!(lock_keys(&server), set([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_tasks_waiting_on_ten_thousand_keys_leave_no_entries() {
    const KEYS: usize = 10_000;
    let server = RedisServer::start();
    let holder = client(&server).await;
    // No re-polls during the test: every waiter is handed its lock by the release.
    let waiters = LockClient::builder(&server.url())
        .repoll_interval(Duration::from_secs(3600))
        .build()
        .await
        .unwrap();
    let names = || (0..KEYS).map(|i| format!("waited-{i}"));

    let held: Vec<LockGuard> = stream::iter(names())
        .map(|name| {
            let holder = holder.clone();
            async move { holder.lock(&name).unwrap().acquire().await.unwrap() }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    let tasks: Vec<_> = names()
        .map(|name| {
            let lock = waiters.lock(&name).unwrap();
            tokio::spawn(async move {
                let guard = lock.acquire().await.unwrap();
                guard.release().await.unwrap();
            })
        })
        .collect();
    // Each waiter's place adds the lock's queue and waiters' terms to its hash (taken free, it
    // keeps no grant block).
    let stored = || lock_keys(&server).len();
    assert!(
        support::eventually(FLOOD_BOUND, || stored() == 3 * KEYS).await,
        "{} keys, not every waiter queued in Redis",
        stored()
    );
    assert_eq!(waiters.queued_waiters(), KEYS);
    assert_eq!(waiters.local_keys(), KEYS);
    let queues = lock_keys(&server)
        .iter()
        .filter(|key| key.ends_with("}:queue"))
        .count();
    assert_eq!(queues, KEYS);

    stream::iter(held)
        .map(LockGuard::release)
        .buffer_unordered(IN_FLIGHT)
        .for_each(|released| async move { released.unwrap() })
        .await;
    let all = futures_util::future::join_all(tasks);
    for task in tokio::time::timeout(FLOOD_BOUND, all)
        .await
        .expect("every waiter was handed its lock")
    {
        task.unwrap();
    }
    assert_eq!(waiters.local_keys(), 0);
    assert_eq!(waiters.queued_waiters(), 0);
    assert_eq!(holder.local_keys(), 0);
    assert_only_fences_remain(&server, names());
}

#[test]
fn the_header_extractor_refuses_what_it_cannot_read_as_one_key() {
    let extractor = HeaderKey::new("x-tenant-id");
    let bytes = header_request(HeaderValue::from_bytes(&[0xff, 0xfe]).unwrap());
    assert!(KeyExtractor::extract(&extractor, &bytes).is_err());
    let tab = header_request(HeaderValue::from_static("a\tb"));
    assert_eq!(
        KeyExtractor::extract(&extractor, &tab).unwrap().as_slice(),
        ["a\tb"]
    );
}
