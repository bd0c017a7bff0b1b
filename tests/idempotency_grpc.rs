//! A gRPC client that goes away mid-handler, against a real tonic server behind
//! `IdempotencyLayer` and a real redis-server: a deadline that passes (`grpc-timeout`, which
//! tonic's server enforces by dropping the call) and a call the client cancels (its stream
//! reset) both end the call, not the deposit's flow; the retry with the same key gets the
//! deposit's reply, and the deposit is made once.
//!
//! The service is routed by hand with prost's derive, as `examples/tonic_accounts.rs` is.

mod support;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::future::BoxFuture;
use http::uri::PathAndQuery;
use support::{RedisServer, client};
use tokio::sync::Notify;
use tonic::body::Body;
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::{Code, Request, Response, Status};
use tonic_prost::ProstCodec;
use tower_redis_lock::IdempotencyLayer;
use tower_redis_lock::layer::MetadataKey;

const DEPOSIT: &str = "/bank.Accounts/Deposit";
/// Bound for what normally takes milliseconds; generous because CI machines are shared.
const SLACK: Duration = Duration::from_secs(20);

#[derive(Clone, PartialEq, prost::Message)]
struct DepositRequest {
    #[prost(int64, tag = "1")]
    amount: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct DepositReply {
    #[prost(uint64, tag = "1")]
    deposit: u64,
}

/// What the handler shares with the test: its runs and deposits, a signal once it has
/// deposited, and the gate it waits at after that, before it answers.
#[derive(Default)]
struct Bank {
    runs: AtomicU64,
    deposits: AtomicU64,
    deposited: Notify,
    gate: Notify,
}

#[derive(Clone)]
struct Accounts(Arc<Bank>);

impl NamedService for Accounts {
    const NAME: &'static str = "bank.Accounts";
}

impl tower::Service<http::Request<Body>> for Accounts {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let bank = self.0.clone();
        Box::pin(async move {
            let mut grpc = Grpc::new(ProstCodec::<DepositReply, DepositRequest>::default());
            Ok(grpc.unary(Deposit(bank), request).await)
        })
    }
}

struct Deposit(Arc<Bank>);

impl UnaryService<DepositRequest> for Deposit {
    type Response = DepositReply;
    type Future = BoxFuture<'static, Result<Response<DepositReply>, Status>>;

    fn call(&mut self, _request: Request<DepositRequest>) -> Self::Future {
        let bank = self.0.clone();
        Box::pin(async move {
            bank.runs.fetch_add(1, Ordering::SeqCst);
            let deposit = bank.deposits.fetch_add(1, Ordering::SeqCst) + 1;
            bank.deposited.notify_one();
            bank.gate.notified().await;
            Ok(Response::new(DepositReply { deposit }))
        })
    }
}

/// Starts the service behind the idempotency layer on a free port; its URL.
async fn serve(server: &RedisServer, bank: Arc<Bank>) -> String {
    let locks = client(server).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let layer = IdempotencyLayer::new(locks).scope(MetadataKey::new("account-id"));
    tokio::spawn(
        Server::builder()
            .layer(layer)
            .add_service(Accounts(bank))
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    url
}

/// A deposit with idempotency `key`, within `deadline` when one is given.
async fn deposit(url: &str, key: &str, deadline: Option<Duration>) -> Result<DepositReply, Status> {
    let channel = Channel::from_shared(url.to_owned())
        .unwrap()
        .connect()
        .await;
    let channel = channel.map_err(|err| Status::unavailable(err.to_string()))?;
    let mut client = tonic::client::Grpc::new(channel);
    client
        .ready()
        .await
        .map_err(|err| Status::unavailable(err.to_string()))?;
    let mut request = Request::new(DepositRequest { amount: 5 });
    request
        .metadata_mut()
        .insert("account-id", "acct-1".parse().unwrap());
    request
        .metadata_mut()
        .insert("idempotency-key", key.parse().unwrap());
    if let Some(deadline) = deadline {
        request.set_timeout(deadline);
    }
    let codec = ProstCodec::<DepositRequest, DepositReply>::default();
    let reply = client
        .unary(request, PathAndQuery::from_static(DEPOSIT), codec)
        .await?;
    Ok(reply.into_inner())
}

/// The first call of `key` ends once the deposit is made (by its deadline, or cancelled by
/// the client as `cancel` says); the flow goes on, and the retry gets its reply.
async fn go_away_then_retry(url: &str, bank: &Bank, key: &str, cancel: bool) {
    let deposited = bank.deposited.notified();
    let deadline = (!cancel).then_some(Duration::from_millis(300));
    let first = tokio::spawn({
        let (url, key) = (url.to_owned(), key.to_owned());
        async move { deposit(&url, &key, deadline).await }
    });
    tokio::time::timeout(SLACK, deposited)
        .await
        .expect("the deposit is made");
    if cancel {
        first.abort();
        assert!(first.await.unwrap_err().is_cancelled());
    } else {
        // tonic's server answers a deadline it enforced as `CANCELLED` ("Timeout expired").
        let ended = tokio::time::timeout(SLACK, first).await.unwrap().unwrap();
        let status = ended.unwrap_err();
        assert!(
            matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled),
            "{status:?}"
        );
    }

    // The retry waits for the first flow, which goes on without its caller.
    let retry = tokio::spawn({
        let (url, key) = (url.to_owned(), key.to_owned());
        async move { deposit(&url, &key, None).await }
    });
    bank.gate.notify_one();
    let retry = tokio::time::timeout(SLACK, retry).await.unwrap().unwrap();
    let deposits = bank.deposits.load(Ordering::SeqCst);
    assert_eq!(
        retry.expect("the first reply"),
        DepositReply { deposit: deposits }
    );
    assert_eq!(
        bank.runs.load(Ordering::SeqCst),
        deposits,
        "{key}: ran again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passed_deadline_or_a_cancelled_call_ends_the_call_not_the_deposit() {
    let server = RedisServer::start();
    let bank = Arc::new(Bank::default());
    let url = serve(&server, bank.clone()).await;

    go_away_then_retry(&url, &bank, "dep-deadline", false).await;
    assert_eq!(bank.deposits.load(Ordering::SeqCst), 1);
    go_away_then_retry(&url, &bank, "dep-cancel", true).await;
    assert_eq!(
        bank.deposits.load(Ordering::SeqCst),
        2,
        "a deposit made twice"
    );
}
