//! What the idempotency layer does in each situation, with its documented defaults.

use std::time::Duration;

use http::HeaderName;
use http::header::{CONTENT_TYPE, ETAG, LOCATION};

use crate::layer::{DEFAULT_RETRY_AFTER, DEFAULT_WAIT, OnMissingKey, OnRedisUnavailable};
use crate::lease::Lease;

/// Default time a stored response is kept: 24 hours, as payment APIs keep theirs.
pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// Default bound on a request body the layer reads to fingerprint the request: 1 MiB.
pub const DEFAULT_MAX_REQUEST_BODY: usize = 1024 * 1024;
/// Default bound on a response body the layer stores: 256 KiB.
pub const DEFAULT_MAX_STORED_BODY: usize = 256 * 1024;
/// The header a replayed response carries, `idempotent-replayed: true`, as Stripe's do.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// What a retry gets when an earlier attempt with its key started its handler and ended
/// without an outcome: its instance stopped or paused past its lease, its lock was lost, or
/// it failed in a way that does not say whether its effect was made. The layer cannot know
/// whether the effect was made; the choice is between making it at most once and at least
/// once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnUnknownOutcome {
    /// At most once (the default): the retry is not run, and is answered 500 (gRPC
    /// `UNKNOWN`) with [`RejectionKind::IdempotencyOutcomeUnknown`](crate::layer::RejectionKind)
    /// until the key's TTL passes, as payment APIs answer a key whose first attempt failed on
    /// their side. Reconcile such a key from the resource itself.
    #[default]
    Refuse,
    /// At least once: the retry runs the handler again. Choose it for handlers that keep
    /// their effect to once themselves: through
    /// [`IdempotencyContext::commit`](super::IdempotencyContext::commit) for data in Redis,
    /// or by recording the key in their own transaction.
    RunAgain,
}

/// Which answers the layer stores and replays to the key's retries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoredAnswers {
    /// Every answer but a server error (5xx, or a gRPC status a retry may cure) and 429 (the
    /// default): a client error the handler answered is the request's outcome, and a retry
    /// with the key gets it again, as payment APIs keep theirs (the draft leaves it open).
    #[default]
    AllButServerErrors,
    /// Successes only (2xx; gRPC `OK`): a client error is not stored and the key's start is
    /// forgotten, so a retry with the key runs again (with the same request: another body
    /// is still 422).
    SuccessOnly,
}

/// How a retry's request is told from the first one with its key: by a fingerprint of its
/// method, path and query, and body.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum BodyComparison {
    /// The body byte for byte (the default): exact, with nothing to parse; the same JSON
    /// with other spacing or member order is another request (422).
    #[default]
    Bytes,
    /// A JSON body parsed: the same members and values are the same request whatever their
    /// order and spacing; a body that is not JSON is compared byte for byte (feature `json`).
    #[cfg(feature = "json")]
    Json,
}

/// What the layer does, with its documented defaults.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) header: HeaderName,
    pub(crate) ttl: Duration,
    pub(crate) wait: Duration,
    pub(crate) retry_after: Duration,
    pub(crate) lease: Lease,
    pub(crate) missing_key: OnMissingKey,
    pub(crate) redis_unavailable: OnRedisUnavailable,
    pub(crate) max_request_body: usize,
    pub(crate) max_stored_body: usize,
    pub(crate) stored_headers: Vec<HeaderName>,
    pub(crate) unknown_outcome: OnUnknownOutcome,
    pub(crate) stored_answers: StoredAnswers,
    pub(crate) body_comparison: BodyComparison,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            header: HeaderName::from_static("idempotency-key"),
            ttl: DEFAULT_TTL,
            wait: DEFAULT_WAIT,
            retry_after: DEFAULT_RETRY_AFTER,
            lease: Lease::Watchdog,
            missing_key: OnMissingKey::PassThrough,
            redis_unavailable: OnRedisUnavailable::FailClosed,
            max_request_body: DEFAULT_MAX_REQUEST_BODY,
            max_stored_body: DEFAULT_MAX_STORED_BODY,
            stored_headers: vec![
                CONTENT_TYPE,
                LOCATION,
                ETAG,
                HeaderName::from_static("grpc-status"),
                HeaderName::from_static("grpc-message"),
            ],
            unknown_outcome: OnUnknownOutcome::Refuse,
            stored_answers: StoredAnswers::AllButServerErrors,
            body_comparison: BodyComparison::Bytes,
        }
    }
}
