//! `IdempotencyLayer`: the configuration, applied to any Tower service of `http::Request`s.

use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use tower::Layer;

use super::record::IdempotencyRecords;
use super::service::IdempotencyService;
use super::settings::{BodyComparison, OnUnknownOutcome, Settings, StoredAnswers};
use crate::client::LockClient;
use crate::layer::log::LayerLog;
use crate::layer::{ConstantKey, DefaultRejection, OnMissingKey, OnRedisUnavailable};
use crate::lease::Lease;

/// Runs a request with an `Idempotency-Key` once, across every instance sharing the Redis,
/// and answers its duplicates with the stored response:
/// `.layer(IdempotencyLayer::new(locks).scope(HeaderKey::new("x-tenant-id")))`.
///
/// Defaults: the header `Idempotency-Key`; one scope for every request (give a
/// [`KeyExtractor`](crate::KeyExtractor) to [`IdempotencyLayer::scope`] so that two tenants'
/// keys never meet); responses kept 24 h ([`DEFAULT_TTL`](super::DEFAULT_TTL)); a duplicate waits at most 10 s
/// for the first to finish, then 409 with `Retry-After: 1`; a request without the header
/// runs as if the layer were not there; Redis unreachable fails closed (503); request
/// bodies up to 1 MiB, stored bodies up to 256 KiB; the headers `content-type`, `location`,
/// `etag`, `grpc-status` and `grpc-message` are stored.
#[derive(Debug, Clone)]
#[must_use]
pub struct IdempotencyLayer<E = ConstantKey, R = DefaultRejection> {
    records: IdempotencyRecords,
    scope: E,
    reject: R,
    settings: Arc<Settings>,
    log: Arc<LayerLog>,
}

impl IdempotencyLayer {
    /// A layer whose requests take their locks and keep their responses on `client`.
    pub fn new(client: LockClient) -> Self {
        Self {
            records: IdempotencyRecords::new(client, ""),
            scope: ConstantKey::new("all"),
            reject: DefaultRejection,
            settings: Arc::new(Settings::default()),
            log: Arc::default(),
        }
    }
}

impl<E, R> IdempotencyLayer<E, R> {
    fn with_settings(mut self, change: impl FnOnce(&mut Settings)) -> Self {
        change(Arc::make_mut(&mut self.settings));
        self
    }

    /// Whose keys these are: a key is looked up within the scope `scope` finds in the
    /// request (its keys joined), so that `HeaderKey::new("x-tenant-id")` keeps one tenant
    /// from replaying another's response. A request whose scope is missing is treated as a
    /// request without an idempotency key ([`IdempotencyLayer::on_missing_key`]), and an
    /// invalid scope is answered 400.
    pub fn scope<E2>(self, scope: E2) -> IdempotencyLayer<E2, R> {
        IdempotencyLayer {
            records: self.records,
            scope,
            reject: self.reject,
            settings: self.settings,
            log: self.log,
        }
    }

    /// The header that carries the key (default `Idempotency-Key`).
    pub fn header(self, header: HeaderName) -> Self {
        self.with_settings(|settings| settings.header = header)
    }

    /// How long a stored response is kept (default 24 h); after it, the key runs again.
    pub fn ttl(self, ttl: Duration) -> Self {
        self.with_settings(|settings| settings.ttl = ttl)
    }

    /// Longest wait of a duplicate for the first request to finish (default 10 s); past it
    /// the duplicate is answered 409 with `Retry-After` (gRPC `ABORTED`).
    pub fn wait_timeout(self, wait: Duration) -> Self {
        self.with_settings(|settings| settings.wait = wait)
    }

    /// `Retry-After` of a 409 or 503 answer (default 1 s, rounded up to whole seconds).
    pub fn retry_after(self, retry_after: Duration) -> Self {
        self.with_settings(|settings| settings.retry_after = retry_after)
    }

    /// The lease of the lock a first request runs under (default [`Lease::Watchdog`]).
    pub fn lease(self, lease: Lease) -> Self {
        self.with_settings(|settings| settings.lease = lease)
    }

    /// What to do with a request without the header (default [`OnMissingKey::PassThrough`]:
    /// it runs, and nothing is stored); [`OnMissingKey::Reject`] answers it 400.
    pub fn on_missing_key(self, missing: OnMissingKey) -> Self {
        self.with_settings(|settings| settings.missing_key = missing)
    }

    /// What to do when Redis is unreachable (default [`OnRedisUnavailable::FailClosed`]:
    /// 503); [`OnRedisUnavailable::FailOpen`] runs the request without the lock and stores
    /// nothing, so a duplicate may run again.
    pub fn on_redis_unavailable(self, unavailable: OnRedisUnavailable) -> Self {
        self.with_settings(|settings| settings.redis_unavailable = unavailable)
    }

    /// What a retry gets when an earlier attempt with its key started and ended without an
    /// outcome (default [`OnUnknownOutcome::Refuse`]: at most once, answered 500);
    /// [`OnUnknownOutcome::RunAgain`] runs it again, for handlers that keep their effect to
    /// once themselves ([`IdempotencyContext`](super::IdempotencyContext)).
    pub fn on_unknown_outcome(self, unknown: OnUnknownOutcome) -> Self {
        self.with_settings(|settings| settings.unknown_outcome = unknown)
    }

    /// Which answers are stored and replayed (default [`StoredAnswers::AllButServerErrors`]:
    /// a client error too); [`StoredAnswers::SuccessOnly`] lets a retry after a 4xx run
    /// again.
    pub fn stored_answers(self, answers: StoredAnswers) -> Self {
        self.with_settings(|settings| settings.stored_answers = answers)
    }

    /// How a retry's body is compared with the first one's (default
    /// [`BodyComparison::Bytes`]); `BodyComparison::Json` (feature `json`) compares parsed
    /// JSON, whatever its spacing and member order.
    pub fn body_comparison(self, comparison: BodyComparison) -> Self {
        self.with_settings(|settings| settings.body_comparison = comparison)
    }

    /// Longest request body the layer reads to fingerprint a request (default 1 MiB); a
    /// longer one is answered 413.
    pub fn max_request_body(self, bytes: usize) -> Self {
        self.with_settings(|settings| settings.max_request_body = bytes)
    }

    /// Longest response body the layer stores (default 256 KiB). A longer response still
    /// reaches its client, and the store keeps only that the request ran: its duplicates
    /// are answered 500 ([`RejectionKind::ResponseNotStored`](crate::layer::RejectionKind)),
    /// never run again.
    pub fn max_stored_body(self, bytes: usize) -> Self {
        self.with_settings(|settings| settings.max_stored_body = bytes)
    }

    /// The response headers stored and replayed (default `content-type`, `location`,
    /// `etag`, `grpc-status`, `grpc-message`). Trailers are stored whole.
    pub fn stored_headers(self, headers: impl IntoIterator<Item = HeaderName>) -> Self {
        let headers = headers.into_iter().collect();
        self.with_settings(|settings| settings.stored_headers = headers)
    }

    /// Prefix of the names this layer's locks and records take (default none), to keep two
    /// layers' keys apart; `lockctl idempotent --layer-prefix` reads them.
    pub fn key_prefix(mut self, prefix: &str) -> Self {
        self.records = IdempotencyRecords::new(self.records.client().clone(), prefix);
        self
    }

    /// Builds the layer's own answers with `reject`, as
    /// [`LockLayer::rejection`](crate::LockLayer::rejection).
    pub fn rejection<R2>(self, reject: R2) -> IdempotencyLayer<E, R2> {
        IdempotencyLayer {
            records: self.records,
            scope: self.scope,
            reject,
            settings: self.settings,
            log: self.log,
        }
    }
}

impl<S, E: Clone, R: Clone> Layer<S> for IdempotencyLayer<E, R> {
    type Service = IdempotencyService<S, E, R>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService::new(
            inner,
            self.records.clone(),
            self.scope.clone(),
            self.reject.clone(),
            self.settings.clone(),
            self.log.clone(),
        )
    }
}
