//! The layer's sharing modes against a real redis-server: fair order of requests across two
//! instances, and read-write sharing by HTTP method. Each `LockClient` stands for one
//! instance of a service, with its own stack.

mod support;

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use support::{RedisServer, client, eventually, queued};
use tokio::sync::Barrier;
use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceExt, service_fn};
use tower_redis_lock::layer::Sharing;
use tower_redis_lock::{HeaderKey, LockClient, LockContext, LockLayer};

/// Bound for waits that normally take milliseconds; generous because CI machines are shared.
const SLACK: Duration = Duration::from_secs(10);

type Http = BoxCloneSyncService<Request<String>, Response<String>, Infallible>;

fn request(method: Method, tenant: &str, label: &str) -> Request<String> {
    Request::builder()
        .method(method)
        .uri("/orders")
        .header("x-tenant-id", tenant)
        .body(label.to_owned())
        .unwrap()
}

/// Readers and writers inside one key's handlers right now, and every overlap seen.
#[derive(Clone, Default)]
struct ReadersAndWriters {
    readers: Arc<AtomicUsize>,
    writers: Arc<AtomicUsize>,
    most_readers: Arc<AtomicUsize>,
    overlaps: Arc<AtomicUsize>,
}

impl ReadersAndWriters {
    fn enter(&self, writing: bool) {
        if writing {
            let writers = self.writers.fetch_add(1, Ordering::SeqCst) + 1;
            if writers > 1 || self.readers.load(Ordering::SeqCst) > 0 {
                self.overlaps.fetch_add(1, Ordering::SeqCst);
            }
        } else {
            let readers = self.readers.fetch_add(1, Ordering::SeqCst) + 1;
            self.most_readers.fetch_max(readers, Ordering::SeqCst);
            if self.writers.load(Ordering::SeqCst) > 0 {
                self.overlaps.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    fn leave(&self, writing: bool) {
        let count = if writing {
            &self.writers
        } else {
            &self.readers
        };
        count.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One instance's stack: a read-write layer over a handler that records what runs at once.
fn read_write_stack(locks: &LockClient, seen: ReadersAndWriters) -> Http {
    let handler = service_fn(move |request: Request<String>| {
        let seen = seen.clone();
        async move {
            assert!(request.extensions().get::<LockContext>().is_some());
            let writing = !matches!(*request.method(), Method::GET | Method::HEAD);
            seen.enter(writing);
            // Long enough for requests of other tasks to arrive while this one runs.
            tokio::time::sleep(Duration::from_millis(5)).await;
            seen.leave(writing);
            Ok::<_, Infallible>(Response::new(String::new()))
        }
    });
    let layer =
        LockLayer::new(locks.clone(), HeaderKey::new("x-tenant-id")).sharing(Sharing::read_write());
    BoxCloneSyncService::new(layer.layer(handler))
}

#[tokio::test]
async fn fair_requests_run_in_the_order_they_arrived_across_instances() {
    let server = RedisServer::start();
    let instances = [client(&server).await, client(&server).await];
    let holder = instances[0]
        .fair_lock("acme")
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let ran = Arc::new(Mutex::new(Vec::new()));
    let mut pending = Vec::new();
    for index in 0..8 {
        let ran = ran.clone();
        let handler = service_fn(move |request: Request<String>| {
            let ran = ran.clone();
            async move {
                ran.lock().unwrap().push(request.body().clone());
                Ok::<_, Infallible>(Response::new(String::new()))
            }
        });
        let layer = LockLayer::new(instances[index % 2].clone(), HeaderKey::new("x-tenant-id"))
            .sharing(Sharing::Fair)
            .wait_timeout(Duration::from_secs(60));
        let call = layer
            .layer(handler)
            .oneshot(request(Method::POST, "acme", &index.to_string()));
        pending.push(tokio::spawn(call));
        assert!(
            eventually(SLACK, || queued(&server, "acme").len() == index + 1).await,
            "request {index} joined the Redis queue"
        );
    }
    holder.release().await.unwrap();
    for call in pending {
        let response = tokio::time::timeout(SLACK, call).await.unwrap().unwrap();
        assert_eq!(response.unwrap().status(), StatusCode::OK);
    }
    let expected: Vec<String> = (0..8).map(|index| index.to_string()).collect();
    assert_eq!(
        *ran.lock().unwrap(),
        expected,
        "handlers ran in arrival order"
    );
}

#[tokio::test]
async fn reads_of_one_tenant_run_together() {
    let server = RedisServer::start();
    let instances = [client(&server).await, client(&server).await];
    let together = Arc::new(Barrier::new(4));
    let mut calls = Vec::new();
    for index in 0..4 {
        let together = together.clone();
        let handler = service_fn(move |_: Request<String>| {
            let together = together.clone();
            async move {
                // Passes only when all four handlers run at once; serialized ones never would.
                let all_in = tokio::time::timeout(SLACK, together.wait()).await.is_ok();
                let status = if all_in {
                    StatusCode::OK
                } else {
                    StatusCode::CONFLICT
                };
                let mut response = Response::new(String::new());
                *response.status_mut() = status;
                Ok::<_, Infallible>(response)
            }
        });
        let method = if index % 2 == 0 {
            Method::GET
        } else {
            Method::HEAD
        };
        let layer = LockLayer::new(instances[index % 2].clone(), HeaderKey::new("x-tenant-id"))
            .sharing(Sharing::read_write());
        calls.push(tokio::spawn(
            layer.layer(handler).oneshot(request(method, "acme", "")),
        ));
    }
    for call in calls {
        let response = call.await.unwrap().unwrap();
        assert_eq!(response.status(), StatusCode::OK, "four readers at once");
    }
}

#[tokio::test]
async fn writes_run_alone_among_reads_across_instances() {
    let server = RedisServer::start();
    let instances = [client(&server).await, client(&server).await];
    let seen = ReadersAndWriters::default();
    let stacks: Vec<Http> = instances
        .iter()
        .map(|locks| read_write_stack(locks, seen.clone()))
        .collect();
    let mut calls = Vec::new();
    for index in 0..120 {
        let method = match index % 4 {
            0 => Method::POST,
            1 => Method::GET,
            2 => Method::HEAD,
            _ => Method::GET,
        };
        let stack = stacks[index % 2].clone();
        calls.push(tokio::spawn(stack.oneshot(request(method, "acme", ""))));
    }
    for call in calls {
        let response = tokio::time::timeout(SLACK * 3, call)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(response.unwrap().status(), StatusCode::OK);
    }
    assert_eq!(
        seen.overlaps.load(Ordering::SeqCst),
        0,
        "a writer never overlapped"
    );
    assert!(
        seen.most_readers.load(Ordering::SeqCst) > 1,
        "readers did share the lock"
    );
}

#[tokio::test]
async fn the_read_methods_are_configurable() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let kinds = Arc::new(Mutex::new(Vec::new()));
    let handler = {
        let kinds = kinds.clone();
        service_fn(move |request: Request<String>| {
            let kinds = kinds.clone();
            async move {
                let context = request.extensions().get::<LockContext>().cloned().unwrap();
                // A reader's lock is shared: another reader of the same tenant gets in too.
                kinds
                    .lock()
                    .unwrap()
                    .push((request.method().clone(), context.fencing_token()));
                Ok::<_, Infallible>(Response::new(String::new()))
            }
        })
    };
    let layer =
        LockLayer::new(locks.clone(), HeaderKey::new("x-tenant-id")).sharing(Sharing::ReadWrite {
            read_methods: vec![Method::GET, Method::OPTIONS],
        });
    let stack = layer.layer(handler);
    let held = locks
        .read_write_lock("acme")
        .unwrap()
        .read()
        .acquire()
        .await
        .unwrap();
    // A reader holds the tenant: OPTIONS (a read here) runs, HEAD (a write here) waits.
    let options = stack
        .clone()
        .oneshot(request(Method::OPTIONS, "acme", ""))
        .await
        .unwrap();
    assert_eq!(options.status(), StatusCode::OK);
    let head = tokio::spawn(stack.clone().oneshot(request(Method::HEAD, "acme", "")));
    assert!(
        eventually(SLACK, || queued(&server, "acme").len() == 1).await,
        "HEAD waits as a writer"
    );
    assert!(!head.is_finished());
    held.release().await.unwrap();
    let head = tokio::time::timeout(SLACK, head)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(head.status(), StatusCode::OK);
    let methods: Vec<Method> = kinds
        .lock()
        .unwrap()
        .iter()
        .map(|(m, _)| m.clone())
        .collect();
    assert_eq!(methods, [Method::OPTIONS, Method::HEAD]);
    assert_eq!(
        Sharing::read_write(),
        Sharing::ReadWrite {
            read_methods: vec![Method::GET, Method::HEAD]
        }
    );
}
