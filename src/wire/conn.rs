//! Command connections: the pool's multiplexed connections checked out once and shared, one
//! per shard of lock keys.
//!
//! A multiplexed connection already pipelines every caller's commands, so checking one out
//! per command would only add the pool's recycle PING to each round trip. Every key always
//! uses the same connection, which keeps the commands about one lock in order (cancel-safety
//! relies on it: an undo sent after a cancelled acquire runs after it on the server), while
//! different keys spread over the pool's connections.

use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use deadpool_redis::Pool;
use redis::aio::MultiplexedConnection;

use crate::error::{ErrorKind, LockError, Result};

pub(crate) struct Connections {
    pool: Pool,
    command_timeout: Duration,
    /// One shared connection per shard, checked out when first needed.
    shards: Vec<Shard>,
    /// Commands and scripts sent, for [`crate::LockClient::round_trips`].
    sent: AtomicU64,
}

struct Shard {
    cached: Mutex<Option<Checkout>>,
    /// Held while a connection is checked out for this shard, so concurrent first uses wait
    /// for that one instead of each taking a pool slot.
    checking_out: tokio::sync::Mutex<()>,
}

struct Checkout {
    // Kept so that the pool counts the connection as in use and recycles it when replaced.
    _pooled: deadpool_redis::Connection,
    shared: MultiplexedConnection,
}

impl std::fmt::Debug for Connections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connections")
            .field("command_timeout", &self.command_timeout)
            .finish_non_exhaustive()
    }
}

impl Shard {
    fn cached(&self) -> Option<MultiplexedConnection> {
        let cached = self.cached.lock().expect("connection shard");
        cached.as_ref().map(|checkout| checkout.shared.clone())
    }
}

impl Connections {
    /// Commands over `shards` connections of `pool` (at most its size), kept checked out.
    pub(crate) fn new(pool: Pool, shards: usize, command_timeout: Duration) -> Self {
        Self {
            shards: (0..shards.clamp(1, pool.status().max_size.max(1)))
                .map(|_| Shard {
                    cached: Mutex::new(None),
                    checking_out: tokio::sync::Mutex::new(()),
                })
                .collect(),
            pool,
            command_timeout,
            sent: AtomicU64::new(0),
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

    fn shard(&self, key: &str) -> &Shard {
        let mut hasher = std::hash::DefaultHasher::new();
        std::hash::Hash::hash(key, &mut hasher);
        let index = std::hash::Hasher::finish(&hasher) as usize % self.shards.len();
        &self.shards[index]
    }

    /// A handle on the connection of `key`'s shard, checking a new one out of the pool when
    /// needed.
    pub(crate) async fn get(&self, key: &str) -> Result<MultiplexedConnection> {
        let shard = self.shard(key);
        if let Some(shared) = shard.cached() {
            return Ok(shared);
        }
        tokio::time::timeout(self.command_timeout, async {
            let _gate = shard.checking_out.lock().await;
            if let Some(shared) = shard.cached() {
                return Ok(shared);
            }
            let pooled = self.pool.get().await?;
            let mut shared = (*pooled).clone();
            // redis-rs cuts a reply off after its response timeout (500 ms by default), and a
            // cut reply to a script that took a lock can no longer be undone once the caller
            // has gone: only the command timeout, which the callers apply, bounds a reply.
            shared.set_response_timeout(Duration::MAX);
            *shard.cached.lock().expect("connection shard") = Some(Checkout {
                shared: shared.clone(),
                _pooled: pooled,
            });
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
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let conn = self.get(key).await?;
        self.bounded(key, command(conn)).await
    }

    /// Awaits a command about `key` within the command timeout, forgetting the connection on
    /// failure.
    pub(crate) async fn bounded<T>(
        &self,
        key: &str,
        command: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T> {
        self.bounded_by(key, self.command_timeout, command).await
    }

    /// [`Self::bounded`] within `limit` instead of the command timeout, for a command that
    /// blocks on the server (WAIT).
    pub(crate) async fn bounded_by<T>(
        &self,
        key: &str,
        limit: Duration,
        command: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T> {
        self.note_sent();
        let outcome = match tokio::time::timeout(limit, command).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(err)) => LockError::from(err),
            Err(_) => LockError::command_timeout(),
        };
        self.note_failure(key, &outcome);
        Err(outcome)
    }

    pub(crate) fn close(&self) {
        for shard in &self.shards {
            shard.cached.lock().expect("connection shard").take();
        }
        self.pool.close();
    }
}
