//! `LockLayer`: the configuration, applied to any Tower service of `http::Request`s.

use std::sync::Arc;
use std::time::Duration;

use tower::Layer;

use super::log::LayerLog;
use super::policy::{OnLeaseLost, OnMissingKey, OnRedisUnavailable, Policy, Sharing};
use super::reject::DefaultRejection;
use super::service::LockService;
use crate::client::LockClient;
use crate::lease::Lease;

/// Serializes the requests that name the same key, across every instance sharing the Redis:
/// `.layer(LockLayer::new(locks, HeaderKey::new("x-tenant-id")))`.
///
/// Defaults: wait at most 10 s ([`DEFAULT_WAIT`](super::DEFAULT_WAIT)) then 503 with
/// `Retry-After: 1` (gRPC `UNAVAILABLE`); a request with no key runs unlocked; Redis
/// unreachable fails closed (503 / `UNAVAILABLE`); a lease lost while the handler runs
/// cancels it (503 / `ABORTED`); watchdog leases; at most 16 keys a request; no key prefix
/// beyond the client's; exclusive locks ([`Sharing::Exclusive`]; [`LockLayer::limit`] lets
/// `n` requests per key in at once).
#[derive(Debug, Clone)]
#[must_use]
pub struct LockLayer<K, R = DefaultRejection> {
    client: LockClient,
    extractor: K,
    reject: R,
    policy: Arc<Policy>,
    /// Shared by every service this layer makes (and by its clones).
    log: Arc<LayerLog>,
}

impl<K> LockLayer<K> {
    /// A layer taking locks from `client` on the keys `extractor` finds in each request.
    pub fn new(client: LockClient, extractor: K) -> Self {
        Self {
            client,
            extractor,
            reject: DefaultRejection,
            policy: Arc::new(Policy::default()),
            log: Arc::default(),
        }
    }
}

impl<K, R> LockLayer<K, R> {
    fn with_policy(mut self, change: impl FnOnce(&mut Policy)) -> Self {
        change(Arc::make_mut(&mut self.policy));
        self
    }

    /// Longest wait for a request's locks (default 10 s); past it the request is answered 503
    /// with `Retry-After` (gRPC `UNAVAILABLE`).
    pub fn wait_timeout(self, wait: Duration) -> Self {
        self.with_policy(|policy| policy.wait = wait)
    }

    /// What to do with a request without a key (default [`OnMissingKey::PassThrough`]).
    /// Choosing `PassThrough` here also silences the warning logged for the first keyless
    /// request of each route.
    pub fn on_missing_key(self, missing: OnMissingKey) -> Self {
        self.with_policy(|policy| {
            policy.missing_key = missing;
            policy.missing_key_chosen = true;
        })
    }

    /// What to do when Redis is unreachable (default [`OnRedisUnavailable::FailClosed`]).
    pub fn on_redis_unavailable(self, unavailable: OnRedisUnavailable) -> Self {
        self.with_policy(|policy| policy.redis_unavailable = unavailable)
    }

    /// What to do when a lease is lost while the handler runs (default
    /// [`OnLeaseLost::Cancel`]).
    pub fn on_lease_lost(self, lost: OnLeaseLost) -> Self {
        self.with_policy(|policy| policy.lease_lost = lost)
    }

    /// The lease of the locks this layer takes (default [`Lease::Watchdog`]).
    pub fn lease(self, lease: Lease) -> Self {
        self.with_policy(|policy| policy.lease = lease)
    }

    /// Prefix of every lock name this layer takes (default none), to keep the keys of two
    /// layers apart: with `"orders:"`, the key `acme` locks `orders:acme`.
    pub fn key_prefix(self, prefix: &str) -> Self {
        self.with_policy(|policy| policy.key_prefix = prefix.to_owned())
    }

    /// Most keys one request may name (default [`DEFAULT_MAX_KEYS`](super::DEFAULT_MAX_KEYS),
    /// 16), counted before duplicates are dropped; more is answered 400 (gRPC
    /// `INVALID_ARGUMENT`) before any key reaches Redis.
    pub fn max_keys(self, max: usize) -> Self {
        self.with_policy(|policy| policy.max_keys = max)
    }

    /// How the requests for one key share its lock (default [`Sharing::Exclusive`]):
    /// `.sharing(Sharing::Fair)` runs them one at a time in the order they arrived, across
    /// every instance; `.sharing(Sharing::read_write())` lets `GET` and `HEAD` requests share
    /// it as readers while any other method runs alone as a writer (a waiting writer is not
    /// overtaken by later readers); [`Sharing::ReadWrite`] names the reading methods;
    /// `.sharing(Sharing::Limit(n))` is [`LockLayer::limit`].
    ///
    /// # Panics
    ///
    /// On `Sharing::Limit(0)`, as [`LockLayer::limit`].
    pub fn sharing(self, sharing: Sharing) -> Self {
        assert!(
            sharing != Sharing::Limit(0),
            "LockLayer::limit(0) would let no request run: a limit must be at least 1"
        );
        self.with_policy(|policy| policy.sharing = sharing)
    }

    /// At most `n` requests per key at once, across every instance, instead of one:
    /// `.limit(3)` is `.sharing(Sharing::Limit(3))`. Each request takes one permit of the
    /// [`Semaphore`](crate::Semaphore) named by its key (after the `key_prefix`; a
    /// semaphore's Redis keys are its own, so it never meets a lock of the same name), in
    /// the order the requests asked across instances; a request with several keys takes one
    /// permit of each, in the canonical order locks are taken in, so no two requests
    /// deadlock. Handlers find their [`LockContext`](super::LockContext) as usual: a fencing
    /// token per key (growing across the key's holders) and the lost signal of the leases.
    ///
    /// The others wait up to the wait bound ([`LockLayer::wait_timeout`]), then get 503 with
    /// `Retry-After`, and gRPC `UNAVAILABLE`, as a lock wait that runs out
    /// ([`RejectionKind::Timeout`](super::RejectionKind::Timeout)): a full limit frees up as
    /// soon as one request ends, and `UNAVAILABLE` says just that (transient; gRPC clients
    /// retry it with backoff), where `RESOURCE_EXHAUSTED` would say a quota is spent that
    /// will not come back soon.
    ///
    /// Every instance must give a key the same `n`: Redis keeps the count while anyone holds
    /// the key's semaphore, and a request of an instance that disagrees runs nowhere; it is
    /// answered 500 (gRPC `INTERNAL`), counted as `permits_mismatch` and logged at ERROR.
    /// So change `n` with a new `key_prefix`, or expect those 500s on busy keys while old
    /// and new instances overlap.
    ///
    /// # Panics
    ///
    /// When `n` is 0: such a layer could run no request.
    pub fn limit(self, n: u32) -> Self {
        self.sharing(Sharing::Limit(n))
    }

    /// `Retry-After` of a 503 answer (default 1 s, rounded up to whole seconds).
    pub fn retry_after(self, retry_after: Duration) -> Self {
        self.with_policy(|policy| policy.retry_after = retry_after)
    }

    /// Builds the layer's own answers (timeouts, Redis down, lost leases, bad keys) with
    /// `reject`, for example a closure `|rejection: &Rejection| -> Response<B>`.
    pub fn rejection<R2>(self, reject: R2) -> LockLayer<K, R2> {
        LockLayer {
            client: self.client,
            extractor: self.extractor,
            reject,
            policy: self.policy,
            log: self.log,
        }
    }
}

impl<S, K: Clone, R: Clone> Layer<S> for LockLayer<K, R> {
    type Service = LockService<S, K, R>;

    fn layer(&self, inner: S) -> Self::Service {
        LockService::new(
            inner,
            self.client.clone(),
            self.extractor.clone(),
            self.reject.clone(),
            self.policy.clone(),
            self.log.clone(),
        )
    }
}
