//! Command connections: the pool's multiplexed connections checked out once and shared, one
//! per shard of lock keys; on a cluster, one cluster connection (itself one multiplexed
//! connection per node, routing each command by its first key's slot).
//!
//! A multiplexed connection already pipelines every caller's commands, so checking one out
//! per command would only add the pool's recycle PING to each round trip. Every key always
//! uses the same connection, which keeps the commands about one lock in order (cancel-safety
//! relies on it: an undo sent after a cancelled acquire runs after it on the server), while
//! different keys spread over the pool's connections.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use deadpool_redis::Pool;
use pin_project::pin_project;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, FromRedisValue, Pipeline, RedisFuture, RedisResult, Value};

use crate::error::{ErrorKind, LockError, Result};
use crate::meter;
use crate::wire::cluster_node::{cluster_node_error, is_cluster_answer, is_cluster_node};
use crate::wire::sentinel::Dialer;

/// A connection to the server, or to the cluster (boxed: waiters keep one, and most clients
/// talk to one server), with what it knows of their functions.
#[derive(Clone)]
pub(crate) enum Conn {
    Server(MultiplexedConnection, Functions),
    Cluster(Box<ClusterConnection>, Functions),
}

/// What a connection learned of its server's or cluster's Redis Functions, shared by the
/// clones of one connection (a new connection learns again): whether they were refused
/// (`FCALL` or `FUNCTION LOAD` unknown or denied), after which its scripts run as scripts
/// (`EVALSHA`) without asking again; and whether it has looked for older releases' functions
/// to delete, which it does once, after its first load.
#[derive(Clone, Default)]
pub(crate) struct Functions(Arc<FunctionsSeen>);

#[derive(Default)]
struct FunctionsSeen {
    refused: AtomicBool,
    older_releases_looked_for: AtomicBool,
}

impl Functions {
    pub(crate) fn refused(&self) -> bool {
        self.0.refused.load(Ordering::Relaxed)
    }

    pub(crate) fn refuse(&self) {
        self.0.refused.store(true, Ordering::Relaxed);
    }

    /// Whether this is the first time this connection asks (a load just succeeded).
    pub(crate) fn first_to_look_for_older_releases(&self) -> bool {
        !self
            .0
            .older_releases_looked_for
            .swap(true, Ordering::Relaxed)
    }
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Server(..) => "Conn::Server",
            Self::Cluster(..) => "Conn::Cluster",
        })
    }
}

impl Conn {
    /// What this connection knows of its server's or cluster's functions.
    pub(crate) fn functions(&self) -> &Functions {
        match self {
            Self::Server(_, functions) | Self::Cluster(_, functions) => functions,
        }
    }

    /// Sends `cmd` and reads its reply as `Cmd::query_async` does, but on one server without
    /// boxing the request: `ConnectionLike` boxes every command's future, and every lock
    /// operation sends one.
    pub(crate) async fn query<T: FromRedisValue>(&mut self, cmd: &Cmd) -> RedisResult<T> {
        let reply = match self {
            Self::Server(conn, _) => conn.send_packed_command(cmd).await?,
            Self::Cluster(conn, _) => conn.req_packed_command(cmd).await?,
        };
        Ok(redis::from_redis_value(reply.extract_error()?)?)
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Server(conn, _) => conn.req_packed_command(cmd),
            Self::Cluster(conn, _) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Server(conn, _) => conn.req_packed_commands(cmd, offset, count),
            Self::Cluster(conn, _) => conn.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Server(conn, _) => conn.get_db(),
            Self::Cluster(conn, _) => conn.get_db(),
        }
    }
}

/// Where connections come from.
enum Source {
    /// One server, at `url` (without credentials, for messages).
    Pool {
        pool: Pool,
        url: String,
    },
    Cluster(Box<ClusterClient>),
    /// New connections go to the master Sentinel names at the time.
    Sentinel(Dialer),
}

pub(crate) struct Connections {
    source: Source,
    command_timeout: Duration,
    /// One shared connection per shard, checked out when first needed.
    shards: Vec<Shard>,
    /// Commands and scripts sent, for [`crate::LockClient::round_trips`].
    sent: AtomicU64,
    /// Whether the client was told at ERROR that its server is a cluster node: once, since a
    /// layer answers the error 500 and says no more.
    told_cluster_node: AtomicBool,
}

struct Shard {
    cached: Mutex<Option<Checkout>>,
    /// Held while a connection is checked out for this shard, so concurrent first uses wait
    /// for that one instead of each taking a pool slot.
    checking_out: tokio::sync::Mutex<()>,
}

struct Checkout {
    // Kept so that the pool counts the connection as in use and recycles it when replaced.
    _pooled: Option<deadpool_redis::Connection>,
    shared: Conn,
}

impl std::fmt::Debug for Connections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connections")
            .field("command_timeout", &self.command_timeout)
            .finish_non_exhaustive()
    }
}

impl Shard {
    fn cached(&self) -> Option<Conn> {
        let cached = self.cached.lock().expect("connection shard");
        cached.as_ref().map(|checkout| checkout.shared.clone())
    }
}

impl Connections {
    /// Commands over `shards` connections of `pool` (at most its size), kept checked out,
    /// to the one server at `url` (without credentials, for messages).
    pub(crate) fn new(pool: Pool, url: String, shards: usize, command_timeout: Duration) -> Self {
        let shards = shards.clamp(1, pool.status().max_size.max(1));
        Self::of(Source::Pool { pool, url }, shards, command_timeout)
    }

    /// Commands over one connection to the cluster of `client`, made when first needed.
    pub(crate) fn cluster(client: ClusterClient, command_timeout: Duration) -> Self {
        Self::of(Source::Cluster(Box::new(client)), 1, command_timeout)
    }

    /// Commands over `shards` connections to the master the sentinels of `dialer` name, each
    /// made again after a failure (a failover), asking the sentinels anew.
    pub(crate) fn sentinel(dialer: Dialer, shards: usize, command_timeout: Duration) -> Self {
        Self::of(Source::Sentinel(dialer), shards.max(1), command_timeout)
    }

    fn of(source: Source, shards: usize, command_timeout: Duration) -> Self {
        Self {
            shards: (0..shards)
                .map(|_| Shard {
                    cached: Mutex::new(None),
                    checking_out: tokio::sync::Mutex::new(()),
                })
                .collect(),
            source,
            command_timeout,
            sent: AtomicU64::new(0),
            told_cluster_node: AtomicBool::new(false),
        }
    }

    pub(crate) fn command_timeout(&self) -> Duration {
        self.command_timeout
    }

    /// Counts one command or script about to be sent.
    pub(crate) fn note_sent(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
    }

    /// Commands and scripts sent so far.
    pub(crate) fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// How many connections the commands spread over.
    pub(crate) fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// The number of the shard, and so of the connection, of `key`.
    pub(crate) fn shard_of(&self, key: &str) -> usize {
        let mut hasher = std::hash::DefaultHasher::new();
        std::hash::Hash::hash(key, &mut hasher);
        std::hash::Hasher::finish(&hasher) as usize % self.shards.len()
    }

    fn shard(&self, key: &str) -> &Shard {
        &self.shards[self.shard_of(key)]
    }

    /// A handle on the connection of `key`'s shard, checking a new one out of the pool when
    /// needed (a checkout that fails is counted as a Redis error).
    pub(crate) async fn get(&self, key: &str) -> Result<Conn> {
        let shard = self.shard(key);
        match shard.cached() {
            Some(shared) => Ok(shared),
            // Boxed: a checkout is rare and its future large, and every command's future
            // would carry it otherwise. Its type is erased too: the connecting futures of the
            // pool and redis-rs nest deep, and every caller's future would have the compiler
            // walk them again to prove it can be sent.
            None => {
                let checkout: Pin<Box<dyn Future<Output = Result<Conn>> + Send + '_>> =
                    Box::pin(self.check_out(shard));
                checkout
                    .await
                    .inspect_err(|err| meter::redis_error(err.kind()))
            }
        }
    }

    /// Checks a connection out for `shard` (one task at a time) and keeps it there.
    async fn check_out(&self, shard: &Shard) -> Result<Conn> {
        tokio::time::timeout(self.command_timeout, async {
            let _gate = shard.checking_out.lock().await;
            if let Some(shared) = shard.cached() {
                return Ok(shared);
            }
            let checkout = match &self.source {
                Source::Pool { pool, url } => {
                    let pooled = pool.get().await?;
                    let mut shared = (*pooled).clone();
                    // redis-rs cuts a reply off after its response timeout (500 ms by
                    // default), and a cut reply to a script that took a lock can no longer be
                    // undone once the caller has gone: only the command timeout, which the
                    // callers apply, bounds a reply.
                    shared.set_response_timeout(Duration::MAX);
                    // A cluster node would redirect most locks and hide most keys from a
                    // listing: refused before any command, whichever the operation.
                    self.note_sent();
                    if is_cluster_node(&mut shared).await? {
                        return Err(self.cluster_node_error(url));
                    }
                    Checkout {
                        shared: Conn::Server(shared, Functions::default()),
                        _pooled: Some(pooled),
                    }
                }
                Source::Sentinel(dialer) => {
                    let mut shared = dialer
                        .client()
                        .await?
                        .get_multiplexed_async_connection()
                        .await?;
                    shared.set_response_timeout(Duration::MAX);
                    Checkout {
                        shared: Conn::Server(shared, Functions::default()),
                        _pooled: None,
                    }
                }
                // Its response timeout is lifted where the cluster client is built.
                Source::Cluster(client) => Checkout {
                    shared: Conn::Cluster(
                        Box::new(client.get_async_connection().await?),
                        Functions::default(),
                    ),
                    _pooled: None,
                },
            };
            let shared = checkout.shared.clone();
            *shard.cached.lock().expect("connection shard") = Some(checkout);
            Ok(shared)
        })
        .await
        .map_err(|_| LockError::command_timeout())?
    }

    /// Forgets `key`'s connection after a failure that may have broken it, or a refusal
    /// after which Redis may close it (a command too long for a client without a password)
    /// or that new credentials may cure.
    pub(crate) fn note_failure(&self, key: &str, err: &LockError) {
        if matches!(
            err.kind(),
            ErrorKind::RedisUnavailable | ErrorKind::AccessDenied
        ) {
            self.shard(key)
                .cached
                .lock()
                .expect("connection shard")
                .take();
        }
    }

    /// Runs one command (or script) about `key` on its connection within the command timeout.
    pub(crate) async fn run<T, F, Fut>(&self, key: &str, command: F) -> Result<T>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let conn = self.get(key).await?;
        self.bounded(key, command(conn)).await
    }

    /// Awaits a command about `key` within the command timeout, forgetting the connection on
    /// failure.
    pub(crate) fn bounded<'a, F: Future>(&'a self, key: &'a str, command: F) -> Bounded<'a, F> {
        self.bounded_by(key, self.command_timeout, command)
    }

    /// [`Self::bounded`] within `limit` instead of the command timeout, for a command that
    /// blocks on the server (WAIT).
    pub(crate) fn bounded_by<'a, F: Future>(
        &'a self,
        key: &'a str,
        limit: Duration,
        command: F,
    ) -> Bounded<'a, F> {
        Bounded {
            command: tokio::time::timeout(limit, command),
            connections: self,
            key,
            counted: false,
        }
    }

    pub(crate) fn close(&self) {
        for shard in &self.shards {
            shard.cached.lock().expect("connection shard").take();
        }
        if let Source::Pool { pool, .. } = &self.source {
            pool.close();
        }
    }

    /// The error of a failed command: an answer only a cluster node gives (`MOVED`,
    /// `CROSSSLOT`) says that the server of a single-server client is one, whatever
    /// `INFO cluster` said.
    pub(crate) fn error_of(&self, err: redis::RedisError) -> LockError {
        match &self.source {
            Source::Pool { url, .. } if is_cluster_answer(&err) => self.cluster_node_error(url),
            _ => LockError::from(err),
        }
    }

    /// [`cluster_node_error`], logged at ERROR the first time.
    fn cluster_node_error(&self, url: &str) -> LockError {
        let error = cluster_node_error(url);
        if !self.told_cluster_node.swap(true, Ordering::Relaxed) {
            tracing::error!(%error, "the lock client is configured for one server, not a cluster");
        }
        error
    }
}

/// A command about `key` awaited within a time limit ([`Connections::bounded`]): counted as
/// sent when first polled, and on failure counted as an error and its connection forgotten.
/// A future of its own, not an `async fn`: the command's future, often large, is then kept
/// once, not once per layer it passes through.
#[pin_project]
pub(crate) struct Bounded<'a, F> {
    #[pin]
    command: tokio::time::Timeout<F>,
    connections: &'a Connections,
    key: &'a str,
    /// Counted as sent already (at the first poll).
    counted: bool,
}

impl<T, F: Future<Output = redis::RedisResult<T>>> Future for Bounded<'_, F> {
    type Output = Result<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if !*this.counted {
            *this.counted = true;
            this.connections.note_sent();
        }
        let outcome = match ready!(this.command.poll(cx)) {
            Ok(Ok(value)) => return Poll::Ready(Ok(value)),
            Ok(Err(err)) => this.connections.error_of(err),
            Err(_) => LockError::command_timeout(),
        };
        meter::redis_error(outcome.kind());
        this.connections.note_failure(this.key, &outcome);
        Poll::Ready(Err(outcome))
    }
}
