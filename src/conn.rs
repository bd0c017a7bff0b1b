//! Command connections: one multiplexed connection checked out of the pool and shared.
//!
//! A multiplexed connection already pipelines every caller's commands, so checking one out
//! per command would only add the pool's recycle PING to each round trip. Sharing one also
//! keeps the commands of one caller in order, which cancel-safety relies on: an abandon sent
//! after a cancelled acquire runs after it on the server.

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
    cached: Mutex<Option<Checkout>>,
    /// Commands and scripts sent, for [`crate::LockClient::round_trips`].
    sent: AtomicU64,
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

impl Connections {
    pub(crate) fn new(pool: Pool, command_timeout: Duration) -> Self {
        Self {
            pool,
            command_timeout,
            cached: Mutex::new(None),
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

    /// A handle on the shared connection, checking a new one out of the pool when needed.
    pub(crate) async fn get(&self) -> Result<MultiplexedConnection> {
        if let Some(checkout) = self.cached.lock().expect("connection cache").as_ref() {
            return Ok(checkout.shared.clone());
        }
        let pooled = tokio::time::timeout(self.command_timeout, self.pool.get())
            .await
            .map_err(|_| LockError::command_timeout())??;
        let mut cached = self.cached.lock().expect("connection cache");
        let checkout = cached.get_or_insert_with(|| Checkout {
            shared: (*pooled).clone(),
            _pooled: pooled,
        });
        Ok(checkout.shared.clone())
    }

    /// Forgets the shared connection after a failure that may have broken it.
    pub(crate) fn note_failure(&self, err: &LockError) {
        if err.kind() == ErrorKind::RedisUnavailable {
            self.cached.lock().expect("connection cache").take();
        }
    }

    /// Runs one command (or script) on the shared connection within the command timeout.
    pub(crate) async fn run<T, F, Fut>(&self, command: F) -> Result<T>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let conn = self.get().await?;
        self.bounded(command(conn)).await
    }

    /// Awaits a command within the command timeout, forgetting the connection on failure.
    pub(crate) async fn bounded<T>(
        &self,
        command: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T> {
        self.note_sent();
        let outcome = match tokio::time::timeout(self.command_timeout, command).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(err)) => LockError::from(err),
            Err(_) => LockError::command_timeout(),
        };
        self.note_failure(&outcome);
        Err(outcome)
    }

    pub(crate) fn close(&self) {
        self.cached.lock().expect("connection cache").take();
        self.pool.close();
    }
}
