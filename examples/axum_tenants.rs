//! An axum service whose order handler does a deliberately non-atomic read-modify-write on
//! a per-tenant counter in Redis: without the lock, concurrent requests for one tenant lose
//! updates. `LockLayer` serializes them across every instance.
//!
//! ```text
//! cargo run --example axum_tenants -- --redis redis://127.0.0.1:6379 --port 3000 --instance a
//! curl -X POST localhost:3000/tenants/acme/orders
//! ```
//!
//! `--port 0` takes any free port; the first line on stdout says which
//! (`{"event":"listening","addr":..,"instance":..}`). SIGTERM or Ctrl-C stops it gracefully.
//! On a Redis Cluster, pass `--cluster` and one `--redis` per seed node.
//!
//! `--background-jobs 1000` runs the service's background jobs, each on one of its instances
//! at a time (`axum_tenants/background.rs`): a reconciliation loop that checks balances while
//! its instance leads (`LockClient::singleton`), and a balance report every 1000 ms of the
//! server's clock (`LockClient::schedule`). A shutdown hands both over at once
//! (`./scripts/demo.sh --singleton`).
//!
//! `GET /metrics` answers the lock metrics in Prometheus's text format
//! (`metrics-exporter-prometheus`), and the lock client names its instance `orders-<instance>`,
//! which `lockctl list` shows beside each holder.
//!
//! `--limit 3` lets three orders per tenant in at once instead of one (`LockLayer::limit`),
//! for handlers that only need a scarce resource shared fairly, not one at a time: the
//! counter is then incremented atomically, and the work takes longer (a call to a partner
//! API, say), so the requests of a busy tenant pile up behind the limit. Each answer says
//! when its handler started and ended, for the demo's checker to count them per tenant
//! (`./scripts/demo.sh --limit 3`).
//!
//! `POST /payments` is an idempotent route (`IdempotencyLayer`, scoped by `x-tenant-id`):
//! see `axum_tenants/payments.rs`, and `./scripts/demo.sh --idempotent`. For the tests that
//! pause and kill instances: `--watchdog-lease-ms` (the client's watchdog lease, renewed
//! every third of it), `--idempotency-wait-ms` (how long a duplicate waits for the first),
//! `--idempotency-ttl-ms` (how long a response is kept), `--payments-commit no` (the charge
//! made without `IdempotencyContext::commit`, under the layer's at-most-once default) and
//! `--payments-sql PATH` (the charge made in SQLite, the key in the same transaction).

#[path = "axum_tenants/background.rs"]
mod background;
#[path = "axum_tenants/ledger.rs"]
mod ledger;
#[path = "axum_tenants/payments.rs"]
mod payments;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use redis::aio::ConnectionLike;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncCommands, Cmd, Pipeline, RedisFuture, Value as RedisValue};
use serde_json::{Value, json};
use tower_redis_lock::layer::RouteParamKey;
use tower_redis_lock::{LockClient, LockClientBuilder, LockContext, LockLayer};

/// Simulated work inside the critical section, between the read and the write.
const WORK: Duration = Duration::from_millis(2);
/// Simulated work under a limit: long beside the time it takes to hand a permit on.
const LIMITED_WORK: Duration = Duration::from_millis(20);

#[derive(Clone)]
struct App {
    instance: String,
    data: Data,
    /// `--limit`: the handlers of one tenant may run together, so the counter is bumped
    /// atomically instead of read, worked on and written.
    limited: bool,
}

/// The tenants' data: on the one Redis, or on the cluster.
#[derive(Clone)]
enum Data {
    /// A pool, which opens a new connection when Redis restarted (a multiplexed connection
    /// alone stays broken).
    Server(deadpool_redis::Pool),
    Cluster(ClusterConnection),
}

impl Data {
    /// The connection one request uses: checked out of the pool once (every checkout costs
    /// Redis the pool's check of the connection, `UNWATCH` and `PING`), or the cluster's.
    async fn for_request(&self) -> redis::RedisResult<RequestConn> {
        Ok(match self {
            Self::Server(pool) => RequestConn::Pooled(pooled(pool).await?),
            Self::Cluster(conn) => RequestConn::Cluster(conn.clone()),
        })
    }
}

/// What one request sends its commands on (see [`Data::for_request`]).
enum RequestConn {
    Pooled(deadpool_redis::Connection),
    Cluster(ClusterConnection),
}

impl ConnectionLike for RequestConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, RedisValue> {
        match self {
            Self::Pooled(conn) => conn.req_packed_command(cmd),
            Self::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<RedisValue>> {
        match self {
            Self::Pooled(conn) => conn.req_packed_commands(cmd, offset, count),
            Self::Cluster(conn) => conn.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// A pooled connection, or why none could be had, as Redis's error.
async fn pooled(pool: &deadpool_redis::Pool) -> redis::RedisResult<deadpool_redis::Connection> {
    pool.get().await.map_err(|err| match err {
        deadpool_redis::PoolError::Backend(err) => err,
        other => std::io::Error::other(other.to_string()).into(),
    })
}

/// Each command on a connection of its own (see [`Data::for_request`]).
impl ConnectionLike for Data {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, RedisValue> {
        Box::pin(async move { self.for_request().await?.req_packed_command(cmd).await })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<RedisValue>> {
        Box::pin(async move {
            let mut conn = self.for_request().await?;
            conn.req_packed_commands(cmd, offset, count).await
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// Reads the tenant's order counter, works a little, writes it back plus one; under a
/// limit, works longer and increments the counter in one command.
async fn create_order(
    State(app): State<App>,
    Path(tenant): Path<String>,
    lock: LockContext,
) -> Result<Json<Value>, (StatusCode, String)> {
    let started_us = now_us();
    let key = format!("orders:{tenant}");
    let failed = |err: redis::RedisError| (StatusCode::INTERNAL_SERVER_ERROR, err.to_string());
    let mut data = app.data.for_request().await.map_err(failed)?;
    let count = if app.limited {
        tokio::time::sleep(LIMITED_WORK).await;
        data.incr(&key, 1_u64).await.map_err(failed)?
    } else {
        let count: Option<u64> = data.get(&key).await.map_err(failed)?;
        let count = count.unwrap_or(0) + 1;
        tokio::time::sleep(WORK).await;
        let () = data.set(&key, count).await.map_err(failed)?;
        count
    };
    Ok(Json(json!({
        "tenant": tenant,
        "instance": app.instance,
        "token": lock.fencing_token(),
        "count": count,
        "waited_us": lock.waited().as_micros() as u64,
        "started_us": started_us,
        "ended_us": now_us(),
    })))
}

/// Microseconds on the wall clock, which every process on the machine shares.
fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_micros() as u64)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut urls, mut port, mut instance, mut cluster, mut limit) =
        (Vec::new(), 3000_u16, "a".to_owned(), false, None);
    let (mut watchdog_lease, mut idempotency) = (None, payments::Idempotency::default());
    // With `--background-jobs PERIOD_MS`: the reconciliation loop and the balance report
    // every period, each on one instance at a time.
    let mut background_jobs = None;
    let millis = |value: &str| value.parse().map(Duration::from_millis);
    while let Some(flag) = args.next() {
        if flag == "--cluster" {
            cluster = true;
            continue;
        }
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--redis" => urls.push(value),
            "--port" => port = value.parse()?,
            "--instance" => instance = value,
            "--limit" => limit = Some(value.parse::<u32>()?),
            "--watchdog-lease-ms" => watchdog_lease = Some(millis(&value)?),
            "--background-jobs" => background_jobs = Some(millis(&value)?),
            "--idempotency-wait-ms" => idempotency.wait = Some(millis(&value)?),
            "--idempotency-ttl-ms" => idempotency.ttl = Some(millis(&value)?),
            "--payments-commit" if value == "no" => idempotency.charge = payments::Charge::Plain,
            "--payments-commit" => idempotency.charge = payments::Charge::Commit,
            "--payments-sql" => {
                let ledger = ledger::Ledger::open(value.into())?;
                idempotency.charge = payments::Charge::Sql(ledger);
            }
            _ => return Err(format!("unknown option {flag}").into()),
        }
    }

    if urls.is_empty() {
        urls.push("redis://127.0.0.1:6379".to_owned());
    }
    // The application picks the exporter; the library only records. Buckets, not the
    // exporter's default summaries, so contrib/'s rules can add instances' waits up.
    let prometheus = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Prefix("redis_lock_".into()),
            tower_redis_lock::HISTOGRAM_BUCKETS,
        )?
        .install_recorder()?;
    tower_redis_lock::describe_metrics();
    let name = format!("orders-{instance}");
    let (locks, data) = if cluster {
        let locks = LockClient::builder_cluster(&urls).instance_name(&name);
        let locks = with_lease(locks, watchdog_lease).build().await?;
        let data = ClusterClient::new(urls.clone())?
            .get_async_connection()
            .await?;
        (locks, Data::Cluster(data))
    } else {
        let locks = LockClient::builder(&urls[0]).instance_name(&name);
        let locks = with_lease(locks, watchdog_lease).build().await?;
        let data = deadpool_redis::Config::from_url(urls[0].as_str())
            .create_pool(Some(deadpool_redis::Runtime::Tokio1))?;
        (locks, Data::Server(data))
    };
    let layer = LockLayer::new(
        locks.clone(),
        RouteParamKey::new("/tenants/{tenant}", "tenant"),
    )
    .key_prefix("tenant:");
    let layer = match limit {
        // At most `n` orders per tenant at once, across every instance.
        Some(n) => layer.limit(n),
        None => layer,
    };
    let payments = payments::router(locks.clone(), data.clone(), instance.clone(), &idempotency);
    let app = Router::new()
        .route("/tenants/{tenant}/orders", post(create_order))
        .with_state(App {
            instance: instance.clone(),
            data,
            limited: limit.is_some(),
        })
        .layer(layer)
        // Merged after the lock layer: payments have their own (the idempotency layer).
        .merge(payments)
        // Merged after the layer: scraping takes no lock.
        .merge(Router::new().route(
            "/metrics",
            get(move || std::future::ready(prometheus.render())),
        ));

    let jobs = match background_jobs {
        Some(period) => Some(background::start(&locks, &instance, period)?),
        None => None,
    };
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    println!(
        "{}",
        json!({
            "event": "listening",
            "addr": addr.to_string(),
            "instance": instance,
            "limit": limit,
        })
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(stop_signal())
        .await?;
    // The jobs first: a leader hands its leadership over at once, not after a lease.
    if let Some((reconciling, reporting)) = jobs {
        reconciling.shutdown().await?;
        reporting.shutdown().await?;
    }
    locks.shutdown().await;
    Ok(())
}

/// The client's watchdog lease, when the command line gives one (else the default, 30 s).
fn with_lease(builder: LockClientBuilder, lease: Option<Duration>) -> LockClientBuilder {
    match lease {
        Some(lease) => builder.watchdog_lease(lease),
        None => builder,
    }
}

async fn stop_signal() {
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
}
