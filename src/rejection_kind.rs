//! Why a layer answered a request itself: a [`RejectionKind`], named in logs, metrics and
//! problem+json answers. It sits below the layers and the meter, which both name it.

/// Why the layer answered a request itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RejectionKind {
    /// The locks were not acquired within the wait bound.
    Timeout,
    /// Redis could not be reached (or failed) while taking the locks.
    RedisUnavailable,
    /// The lease was lost while the handler ran, and the handler was cancelled.
    LeaseLost,
    /// The request named no key and the policy rejects such requests.
    MissingKey,
    /// A key was unusable: not text, empty, longer than the limit, or sent twice.
    InvalidKey,
    /// The request named more keys than the layer allows.
    TooManyKeys,
    /// The lock client was shut down.
    ShutDown,
    /// The wait bound passed during a restart quarantine: Redis lost its data and grants no
    /// lock until every holder of a lost lock has been told.
    RestartQuarantine,
    /// A key's limit ([`LockLayer::limit`](crate::LockLayer::limit)) is held in Redis with
    /// another count than this layer's: two instances are configured differently. The
    /// request did not run; a retry cannot help until the configurations agree.
    PermitsMismatch,
    /// The request body was longer than the bound of the layer that reads it (keys taken
    /// from the body, or an idempotent request's fingerprint).
    BodyTooLarge,
    /// The request body could not be read (the client went away, say).
    BodyUnreadable,
    /// An idempotency key was missing where the policy asks for one, or malformed.
    InvalidIdempotencyKey,
    /// An idempotency key came back with another request (method, path or body) than the
    /// one it was first used for.
    IdempotencyKeyReused,
    /// The first request with this idempotency key was still running when the wait bound
    /// passed.
    IdempotencyInProgress,
    /// The first request with this idempotency key ran, but its response was not stored
    /// (longer than the store's bound), so it can be neither replayed nor run again.
    ResponseNotStored,
    /// An earlier request with this idempotency key started its handler and ended without
    /// an outcome (its instance stopped or paused past its lease, or its lock was lost): it
    /// may have made its effect, so it is not run again
    /// ([`OnUnknownOutcome::Refuse`](crate::idempotency::OnUnknownOutcome::Refuse)).
    IdempotencyOutcomeUnknown,
    /// The lock client is configured wrongly for its Redis (a single-server client given a
    /// node of a Redis Cluster): no retry can help until the configuration is fixed, and the
    /// client logs the error once.
    Misconfigured,
}

impl RejectionKind {
    /// Every kind, for the metric series started at 0 when a client starts.
    #[cfg(feature = "metrics")]
    pub(crate) const ALL: [Self; 17] = [
        Self::Timeout,
        Self::RedisUnavailable,
        Self::LeaseLost,
        Self::MissingKey,
        Self::InvalidKey,
        Self::TooManyKeys,
        Self::ShutDown,
        Self::RestartQuarantine,
        Self::PermitsMismatch,
        Self::BodyTooLarge,
        Self::BodyUnreadable,
        Self::InvalidIdempotencyKey,
        Self::IdempotencyKeyReused,
        Self::IdempotencyInProgress,
        Self::ResponseNotStored,
        Self::IdempotencyOutcomeUnknown,
        Self::Misconfigured,
    ];

    /// A short name, for logs, metrics and the `kind` member of a problem+json answer:
    /// `timeout`, `redis_unavailable`, `lease_lost`, `missing_key`, `invalid_key`,
    /// `too_many_keys`, `shut_down`, `restart_quarantine`, `permits_mismatch`,
    /// `body_too_large`, `body_unreadable`, `invalid_idempotency_key`, `idempotency_key_reused`,
    /// `idempotency_in_progress`, `response_not_stored`, `idempotency_outcome_unknown` or
    /// `misconfigured`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::RedisUnavailable => "redis_unavailable",
            Self::LeaseLost => "lease_lost",
            Self::MissingKey => "missing_key",
            Self::InvalidKey => "invalid_key",
            Self::TooManyKeys => "too_many_keys",
            Self::ShutDown => "shut_down",
            Self::RestartQuarantine => "restart_quarantine",
            Self::PermitsMismatch => "permits_mismatch",
            Self::BodyTooLarge => "body_too_large",
            Self::BodyUnreadable => "body_unreadable",
            Self::InvalidIdempotencyKey => "invalid_idempotency_key",
            Self::IdempotencyKeyReused => "idempotency_key_reused",
            Self::IdempotencyInProgress => "idempotency_in_progress",
            Self::ResponseNotStored => "response_not_stored",
            Self::IdempotencyOutcomeUnknown => "idempotency_outcome_unknown",
            Self::Misconfigured => "misconfigured",
        }
    }
}

#[cfg(all(test, feature = "metrics"))]
mod tests {
    use std::collections::HashSet;

    use super::RejectionKind::{self, *};

    #[test]
    fn every_kind_is_in_the_table_once() {
        // A new kind fails to compile in the match until it is listed here too.
        let every = [
            Timeout,
            RedisUnavailable,
            LeaseLost,
            MissingKey,
            InvalidKey,
            TooManyKeys,
            ShutDown,
            RestartQuarantine,
            PermitsMismatch,
            BodyTooLarge,
            BodyUnreadable,
            InvalidIdempotencyKey,
            IdempotencyKeyReused,
            IdempotencyInProgress,
            ResponseNotStored,
            IdempotencyOutcomeUnknown,
            Misconfigured,
        ];
        for kind in every {
            match kind {
                Timeout
                | RedisUnavailable
                | LeaseLost
                | MissingKey
                | InvalidKey
                | TooManyKeys
                | ShutDown
                | RestartQuarantine
                | PermitsMismatch
                | BodyTooLarge
                | BodyUnreadable
                | InvalidIdempotencyKey
                | IdempotencyKeyReused
                | IdempotencyInProgress
                | ResponseNotStored
                | IdempotencyOutcomeUnknown
                | Misconfigured => {}
            }
        }
        let listed: HashSet<&str> = RejectionKind::ALL.map(RejectionKind::as_str).into();
        assert_eq!(listed.len(), RejectionKind::ALL.len(), "a kind twice");
        assert_eq!(listed, every.map(RejectionKind::as_str).into());
    }
}
