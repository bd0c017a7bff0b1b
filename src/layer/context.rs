//! `LockContext`: what a handler learns of the locks it runs under.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::select_all;

use crate::guard::{LockGuard, LostSignal};
use crate::lease::LostReason;

/// The locks a request runs under, in its extensions (`Extension<LockContext>` in axum,
/// `request.extensions().get::<LockContext>()` in tonic). Pass the fencing tokens to the
/// resources the handler writes, and watch [`LockContext::lost`] in long handlers.
#[derive(Debug, Clone)]
pub struct LockContext {
    held: Arc<[Held]>,
    waited: Duration,
}

#[derive(Debug)]
struct Held {
    name: String,
    token: u64,
    lost: LostSignal,
}

impl LockContext {
    /// The locks `held` (each name with its fencing token), none of whose leases is ever
    /// lost, taken after no wait: for unit tests of handlers, with no layer and no Redis.
    ///
    /// ```
    /// use tower_redis_lock::LockContext;
    ///
    /// let context = LockContext::detached([("tenant:acme", 42)]);
    /// assert_eq!(context.fencing_token(), 42);
    /// assert!(!context.is_lost());
    /// ```
    pub fn detached<N: Into<String>>(held: impl IntoIterator<Item = (N, u64)>) -> Self {
        Self {
            waited: Duration::ZERO,
            held: held
                .into_iter()
                .map(|(name, token)| Held {
                    name: name.into(),
                    token,
                    lost: LostSignal::never(),
                })
                .collect(),
        }
    }

    pub(crate) fn new(guards: &[LockGuard], waited: Duration) -> Self {
        Self {
            waited,
            held: guards
                .iter()
                .map(|guard| Held {
                    name: guard.name().to_owned(),
                    token: guard.fencing_token(),
                    lost: guard.lost_signal(),
                })
                .collect(),
        }
    }

    /// How long the request waited for its locks.
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// The lock names held, in the canonical order they were taken.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.held.iter().map(|held| held.name.as_str())
    }

    /// The fencing token of the first (for one key: the only) lock.
    pub fn fencing_token(&self) -> u64 {
        self.held.first().map_or(0, |held| held.token)
    }

    /// The fencing token of the lock `name`, if the request holds it.
    pub fn fencing_token_of(&self, name: &str) -> Option<u64> {
        self.held
            .iter()
            .find(|held| held.name == name)
            .map(|held| held.token)
    }

    /// Whether any of the request's leases has been lost.
    pub fn is_lost(&self) -> bool {
        self.held.iter().any(|held| held.lost.is_lost())
    }

    /// Resolves when any of the request's leases is lost.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only waits.
    pub async fn lost(&self) -> LostReason {
        if self.held.is_empty() {
            return std::future::pending().await;
        }
        let signals = self.held.iter().map(|held| {
            let signal = held.lost.clone();
            Box::pin(async move { signal.lost().await })
        });
        select_all(signals).await.0
    }
}
