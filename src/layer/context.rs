//! `LockContext`: what a handler learns of the locks it runs under.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::select_all;

use super::held::HeldWrites;
use crate::error::{ErrorKind, LockError, Result};
use crate::guard::{LockGuard, LostSignal};
use crate::guarded_write::GuardedWrites;
use crate::keys::{DEFAULT_PREFIX, LockKeys};
use crate::lease::LostReason;

/// The locks a request runs under, in its extensions (`Extension<LockContext>` in axum,
/// `request.extensions().get::<LockContext>()` in tonic). Pass the fencing tokens to the
/// resources the handler writes, and watch [`LockContext::lost`] in long handlers. For data
/// in Redis, [`LockContext::write_if_held`] writes only while the layer's lock is held.
#[derive(Debug, Clone)]
pub struct LockContext {
    held: Arc<[Held]>,
    waited: Duration,
    /// `None` for a detached context: no lock in Redis to write under.
    writes: Option<HeldWrites>,
}

#[derive(Debug)]
struct Held {
    name: String,
    token: u64,
    lost: LostSignal,
    hash_tag: String,
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
            writes: None,
            held: held
                .into_iter()
                .map(|(name, token)| {
                    let name = name.into();
                    let hash_tag = LockKeys::new(DEFAULT_PREFIX, &name)
                        .map(|keys| keys.hash_tag().to_owned())
                        .unwrap_or_default();
                    Held {
                        name,
                        token,
                        lost: LostSignal::never(),
                        hash_tag,
                    }
                })
                .collect(),
        }
    }

    /// The context of `guards`; see [`LockContext::writing_through`].
    pub(crate) fn new(guards: &[LockGuard], waited: Duration) -> Self {
        Self {
            waited,
            writes: None,
            held: guards
                .iter()
                .map(|guard| Held {
                    name: guard.name().to_owned(),
                    token: guard.fencing_token(),
                    lost: guard.lost_signal(),
                    hash_tag: guard.hash_tag().to_owned(),
                })
                .collect(),
        }
    }

    /// The context whose handler writes under the layer's guards through `writes`.
    pub(crate) fn writing_through(mut self, writes: HeldWrites) -> Self {
        self.writes = Some(writes);
        self
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

    /// The cluster hash tag of the first (for one key: the only) lock, `{<escaped name>}`:
    /// a key that contains it lands in the lock's slot, so [`LockContext::write_if_held`] can
    /// reach it on a Redis Cluster too: `format!("balance:{}", context.hash_tag())`. Empty
    /// when the request holds no lock.
    pub fn hash_tag(&self) -> &str {
        self.held.first().map_or("", |held| held.hash_tag.as_str())
    }

    /// The cluster hash tag of the lock `name`, if the request holds it.
    pub fn hash_tag_of(&self, name: &str) -> Option<&str> {
        self.held
            .iter()
            .find(|held| held.name == name)
            .map(|held| held.hash_tag.as_str())
    }

    /// Applies `writes` in one Redis script only while the request still holds its first
    /// (for one key: its only) lock: `Ok(true)` applied, `Ok(false)` refused, nothing
    /// written. It is [`LockGuard::write_if_held`] for a handler behind the layer: Redis
    /// checks, in the script that writes, that the lock is still this request's, so a
    /// handler whose instance paused past its lease writes nothing when it resumes, even
    /// before it is told. A write the handler started is answered before the layer releases
    /// the lock, and none starts after; a refused write means the handler must not answer
    /// as if it had written.
    ///
    /// On a Redis Cluster every key must carry the lock's [hash tag](LockContext::hash_tag).
    ///
    /// # Cancel safety
    ///
    /// The script runs to its answer whether or not the caller waits for it, and the layer
    /// waits for that answer before it releases the lock.
    ///
    /// # Errors
    ///
    /// As [`LockGuard::write_if_held`];
    /// [`ErrorKind::UnsupportedGuard`](crate::ErrorKind::UnsupportedGuard) for a
    /// [detached](LockContext::detached) context (no lock in Redis) and for a request that
    /// shares its lock (a reader of [`Sharing::ReadWrite`](crate::layer::Sharing::ReadWrite), a per-key
    /// limit).
    pub async fn write_if_held(&self, writes: &GuardedWrites) -> Result<bool> {
        self.held_writes()?.write_if_held(None, writes).await
    }

    /// As [`LockContext::write_if_held`], under the lock `name` of a request that holds
    /// several: its keys must carry that lock's [hash tag](LockContext::hash_tag_of) on a
    /// cluster.
    ///
    /// # Errors
    ///
    /// As [`LockContext::write_if_held`], and
    /// [`ErrorKind::NotOwner`](crate::ErrorKind::NotOwner) when the request holds no lock
    /// named `name`.
    pub async fn write_if_held_under(&self, name: &str, writes: &GuardedWrites) -> Result<bool> {
        self.held_writes()?.write_if_held(Some(name), writes).await
    }

    fn held_writes(&self) -> Result<&HeldWrites> {
        self.writes.as_ref().ok_or_else(|| {
            LockError::new(
                ErrorKind::UnsupportedGuard,
                "a detached LockContext holds no lock in Redis to write under",
            )
        })
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
