//! A tonic service with one lock per account, taken from the `account-id` metadata.
//!
//! The Deposit handler does a deliberately non-atomic read-modify-write of the balance in
//! Redis. The example starts two server instances (each with its own `LockClient`), sends
//! concurrent deposits through both, checks that no deposit was lost, then shows the answer
//! a client gets when an account stays locked past the wait bound: `UNAVAILABLE`. Deposits
//! that carry an `idempotency-key` (metadata) are made once: the same deposit sent again, to
//! the other instance, gets the first reply (`IdempotencyLayer`, outside the lock layer).
//!
//! ```text
//! cargo run --example tonic_accounts -- --redis redis://127.0.0.1:6379
//! ```
//!
//! The messages are declared with prost's derive and the service is routed by hand, so no
//! `protoc` is needed:
//!
//! ```proto
//! service Accounts { rpc Deposit(DepositRequest) returns (DepositReply); }
//! message DepositRequest { int64 amount = 1; }
//! message DepositReply { int64 balance = 1; uint64 token = 2; }
//! ```

use std::convert::Infallible;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::future::BoxFuture;
use http::uri::PathAndQuery;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use serde_json::json;
use tonic::body::Body;
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::{Code, Request, Response, Status};
use tonic_prost::ProstCodec;
use tower::ServiceBuilder;
use tower_redis_lock::layer::MetadataKey;
use tower_redis_lock::{IdempotencyLayer, LockClient, LockContext, LockLayer};

const DEPOSIT: &str = "/bank.Accounts/Deposit";

/// `DepositRequest`: the account comes from the `account-id` metadata.
#[derive(Clone, PartialEq, prost::Message)]
struct DepositRequest {
    #[prost(int64, tag = "1")]
    amount: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct DepositReply {
    #[prost(int64, tag = "1")]
    balance: i64,
    #[prost(uint64, tag = "2")]
    token: u64,
}

/// The `bank.Accounts` service.
#[derive(Clone)]
struct Accounts {
    data: MultiplexedConnection,
}

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
        let accounts = self.clone();
        Box::pin(async move {
            if request.uri().path() != DEPOSIT {
                return Ok(Status::unimplemented("unknown method").into_http());
            }
            let mut grpc = Grpc::new(ProstCodec::<DepositReply, DepositRequest>::default());
            Ok(grpc.unary(Deposit(accounts), request).await)
        })
    }
}

struct Deposit(Accounts);

impl UnaryService<DepositRequest> for Deposit {
    type Response = DepositReply;
    type Future = BoxFuture<'static, Result<Response<DepositReply>, Status>>;

    fn call(&mut self, request: Request<DepositRequest>) -> Self::Future {
        let mut data = self.0.data.clone();
        Box::pin(async move {
            let lock = request
                .extensions()
                .get::<LockContext>()
                .cloned()
                .ok_or_else(|| Status::invalid_argument("account-id metadata missing"))?;
            let account = request
                .metadata()
                .get("account-id")
                .and_then(|value| value.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            let key = format!("balance:{account}");
            let failed = |err: redis::RedisError| Status::internal(err.to_string());
            let balance: Option<i64> = data.get(&key).await.map_err(failed)?;
            tokio::time::sleep(Duration::from_millis(1)).await;
            let balance = balance.unwrap_or(0) + request.get_ref().amount;
            let () = data.set(&key, balance).await.map_err(failed)?;
            Ok(Response::new(DepositReply {
                balance,
                token: lock.fencing_token(),
            }))
        })
    }
}

/// Starts one server instance on a free port with its own lock client; returns its URL.
async fn start_instance(
    redis_url: &str,
    wait: Duration,
) -> Result<String, Box<dyn std::error::Error>> {
    let data = redis::Client::open(redis_url)?
        .get_multiplexed_async_connection()
        .await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let locks = LockClient::connect(redis_url).await?;
    // Outermost first: a duplicate deposit is answered before it waits for the account.
    let layers = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(locks.clone()).scope(MetadataKey::new("account-id")))
        .layer(LockLayer::new(locks, MetadataKey::new("account-id")).wait_timeout(wait));
    tokio::spawn(
        Server::builder()
            .layer(layers)
            .add_service(Accounts { data })
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    Ok(format!("http://{addr}"))
}

async fn deposit(channel: Channel, account: &str, amount: i64) -> Result<DepositReply, Status> {
    deposit_once(channel, account, amount, None).await
}

/// A deposit with an idempotency key, when `key` names one.
async fn deposit_once(
    channel: Channel,
    account: &str,
    amount: i64,
    key: Option<&str>,
) -> Result<DepositReply, Status> {
    let mut client = tonic::client::Grpc::new(channel);
    client
        .ready()
        .await
        .map_err(|err| Status::unavailable(err.to_string()))?;
    let mut request = Request::new(DepositRequest { amount });
    request
        .metadata_mut()
        .insert("account-id", account.parse().expect("ASCII account"));
    if let Some(key) = key {
        let key = key.parse().expect("ASCII key");
        request.metadata_mut().insert("idempotency-key", key);
    }
    let codec = ProstCodec::<DepositRequest, DepositReply>::default();
    let reply = client
        .unary(request, PathAndQuery::from_static(DEPOSIT), codec)
        .await?;
    Ok(reply.into_inner())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let redis_url = match (args.next().as_deref(), args.next()) {
        (Some("--redis"), Some(url)) => url,
        _ => return Err("usage: tonic_accounts --redis URL".into()),
    };
    // The deposits' instances wait as long as a queue of 50 deposits per account can take on
    // a busy machine; a third instance, with a 300 ms bound, shows the answer past the bound.
    let (patient, short) = (Duration::from_secs(10), Duration::from_millis(300));
    let mut channels = Vec::new();
    for wait in [patient, patient, short] {
        let url = start_instance(&redis_url, wait).await?;
        channels.push(Channel::from_shared(url)?.connect().await?);
    }

    // 200 deposits of 1 over four accounts, spread over both instances.
    let deposits = 200;
    let calls: Vec<_> = (0..deposits)
        .map(|i| {
            let channel = channels[i % 2].clone();
            tokio::spawn(async move { deposit(channel, &format!("acct-{}", i % 4), 1).await })
        })
        .collect();
    let mut failed = 0;
    for call in calls {
        if call.await?.is_err() {
            failed += 1;
        }
    }
    let mut data = redis::Client::open(redis_url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let mut total = 0;
    for account in 0..4 {
        let balance: Option<i64> = data.get(format!("balance:acct-{account}")).await?;
        total += balance.unwrap_or(0);
    }

    // An account held elsewhere past the third instance's 300 ms bound: UNAVAILABLE.
    let holder = LockClient::connect(&redis_url).await?;
    let held = holder.lock("frozen")?.acquire().await?;
    let refused = deposit(channels[2].clone(), "frozen", 1).await;
    held.release().await?;
    let refused_code = refused.as_ref().err().map(Status::code);

    // One deposit of 5 sent twice, to each instance, with one idempotency key: made once.
    let first = deposit_once(channels[0].clone(), "acct-0", 5, Some("dep-1")).await?;
    let again = deposit_once(channels[1].clone(), "acct-0", 5, Some("dep-1")).await?;
    let balance: Option<i64> = data.get("balance:acct-0").await?;
    let deposited_once = first == again && balance == Some(first.balance);

    let ok = failed == 0
        && total == deposits as i64
        && refused_code == Some(Code::Unavailable)
        && deposited_once;
    println!(
        "{}",
        json!({
            "deposits": deposits,
            "failed": failed,
            // A deposit refused (`failed`) was not made: lost is one made and overwritten.
            "lost_updates": (deposits - failed) as i64 - total,
            "locked_account_answer": format!("{refused_code:?}"),
            "idempotent_deposit_made_once": deposited_once,
            "ok": ok,
        })
    );
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}
