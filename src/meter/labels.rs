//! Every value a label takes: each label set is one table or one enum, so the series a
//! client starts at 0 (`super::start_at_zero`) are the series it can count, and a new value
//! is counted and started alike.

use crate::error::ErrorKind;
use crate::lease::LostReason;
use crate::lock_kind::LockKind;

/// The label of a lock kind, or of a composite lock (`multi`, `redlock`, `segmented`).
pub(crate) fn kind_label(kind: LockKind) -> &'static str {
    match kind {
        LockKind::Exclusive => "exclusive",
        LockKind::Fair => "fair",
        LockKind::Read => "read",
        LockKind::Write => "write",
        LockKind::Semaphore { .. } => "semaphore",
    }
}

/// Every value of the `kind` label: the lock kinds ([`kind_label`]) and the composite locks.
#[cfg(feature = "metrics")]
pub(crate) const KINDS: [&str; 8] = [
    "exclusive",
    "fair",
    "read",
    "write",
    "semaphore",
    "multi",
    "redlock",
    "segmented",
];

/// Every value of the `outcome` label of `redis_lock_acquisitions_total`: what
/// [`outcome_of`] gives, and `cancelled` for an acquisition dropped before it ended.
#[cfg(feature = "metrics")]
pub(crate) const OUTCOMES: [&str; 8] = [
    "acquired",
    "busy",
    "timeout",
    "unavailable",
    "denied",
    "cancelled",
    "shut_down",
    "error",
];

/// How one acquisition ended, as `redis_lock_acquisitions_total` counts it.
pub(crate) fn outcome_of<T>(result: Result<Option<&T>, &crate::LockError>) -> &'static str {
    match result {
        Ok(Some(_)) => "acquired",
        Ok(None) => "busy",
        Err(err) => match err.kind() {
            ErrorKind::Timeout | ErrorKind::RestartQuarantine => "timeout",
            ErrorKind::RedisUnavailable | ErrorKind::QuorumUnreachable => "unavailable",
            ErrorKind::AccessDenied => "denied",
            ErrorKind::ShutDown => "shut_down",
            _ => "error",
        },
    }
}

/// How a waiter got a lock from the holder before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HandoverPath {
    /// From a task of the same client, without Redis.
    Local,
    /// Granted from the Redis queue by the holder's release (or found granted by a look).
    Redis,
}

impl HandoverPath {
    /// Every path, for the series started at 0.
    #[cfg(feature = "metrics")]
    pub(crate) const ALL: [Self; 2] = [Self::Local, Self::Redis];

    /// The label `redis_lock_handovers_total` and the lock span show.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Local => "local",
            Self::Redis => "redis",
        }
    }
}

/// Every reason a lease is lost, for the series started at 0.
#[cfg(feature = "metrics")]
pub(crate) const LOST_REASONS: [LostReason; 5] = [
    LostReason::Expired,
    LostReason::Taken,
    LostReason::Unreachable,
    LostReason::ShutDown,
    LostReason::DataLost,
];

/// The label of a lost lease's reason.
pub(crate) fn lost_label(reason: LostReason) -> &'static str {
    match reason {
        LostReason::Expired => "expired",
        LostReason::Taken => "taken",
        LostReason::Unreachable => "unreachable",
        LostReason::ShutDown => "shut_down",
        LostReason::DataLost => "data_lost",
    }
}

/// How the watchdog's renewal of a lease ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// The lease was renewed.
    Renewed,
    /// The lock was found deleted or held by another owner.
    Taken,
    /// Redis could not be reached (or failed) to renew it.
    Failed,
}

impl Renewal {
    /// Every outcome, for the series started at 0.
    #[cfg(feature = "metrics")]
    pub(crate) const ALL: [Self; 3] = [Self::Renewed, Self::Taken, Self::Failed];

    /// The label `redis_lock_renewals_total` shows.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Renewed => "renewed",
            Self::Taken => "taken",
            Self::Failed => "failed",
        }
    }
}

/// Every value of the `kind` label of `redis_lock_redis_errors_total`: what
/// [`redis_error_label`] gives.
#[cfg(feature = "metrics")]
pub(crate) const REDIS_ERROR_KINDS: [&str; 5] = [
    "unavailable",
    "denied",
    "shut_down",
    "invalid_config",
    "redis",
];

/// The label of a failed Redis command's error.
pub(crate) fn redis_error_label(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::RedisUnavailable => "unavailable",
        ErrorKind::AccessDenied => "denied",
        ErrorKind::ShutDown => "shut_down",
        ErrorKind::InvalidConfig => "invalid_config",
        _ => "redis",
    }
}

/// What the idempotency layer did with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IdempotentOutcome {
    /// Ran first for its key, and its response was stored.
    First,
    /// Answered with the stored response of its key.
    Replayed,
    /// Its key was first used with another request: 422.
    Mismatch,
    /// The first request for its key still ran when the wait bound passed: 409.
    InProgress,
    /// Ran, and its response is not kept (a server error, 429, or a body that failed).
    NotStored,
    /// Ran, and its response was over the store's bound: only that it ran is kept.
    OverBound,
    /// Ran, and the store refused its response: the lock was no longer its.
    Refused,
    /// Cancelled: its lock's lease was lost while it ran.
    LeaseLost,
    /// Ran, and its response could not be stored (Redis failed).
    StoreFailed,
    /// Ran without its key, Redis being unreachable and the policy failing open.
    Unguarded,
    /// Had no key (or no scope) and ran as if the layer were not there.
    NoKey,
    /// Answered by the layer: a bad key or body, or Redis unreachable.
    Rejected,
    /// Not run: an earlier attempt with its key started and ended without an outcome.
    OutcomeUnknown,
}

impl IdempotentOutcome {
    /// Every outcome, for the series started at 0.
    #[cfg(feature = "metrics")]
    pub(crate) const ALL: [Self; 13] = [
        Self::First,
        Self::Replayed,
        Self::Mismatch,
        Self::InProgress,
        Self::NotStored,
        Self::OverBound,
        Self::Refused,
        Self::LeaseLost,
        Self::StoreFailed,
        Self::Unguarded,
        Self::NoKey,
        Self::Rejected,
        Self::OutcomeUnknown,
    ];

    /// The label `redis_lock_idempotent_total` shows.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::First => "first",
            Self::Replayed => "replayed",
            Self::Mismatch => "mismatch",
            Self::InProgress => "in_progress",
            Self::NotStored => "not_stored",
            Self::OverBound => "over_bound",
            Self::Refused => "refused",
            Self::LeaseLost => "lease_lost",
            Self::StoreFailed => "store_failed",
            Self::Unguarded => "unguarded",
            Self::NoKey => "no_key",
            Self::Rejected => "rejected",
            Self::OutcomeUnknown => "outcome_unknown",
        }
    }
}

/// Each table against the enum or function whose labels it lists. The matches below have no
/// catch-all arm: a new variant stops this module compiling until it is listed beside the
/// match, and the test then finds it missing from the table if it is.
#[cfg(all(test, feature = "metrics"))]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::LockError;

    /// Asserts that `labels` are distinct and are exactly `expected`.
    fn same_set<const N: usize>(labels: [&'static str; N], expected: &[&'static str]) {
        let distinct: HashSet<&str> = labels.iter().copied().collect();
        assert_eq!(distinct.len(), N, "a label twice: {labels:?}");
        assert_eq!(distinct, expected.iter().copied().collect(), "{labels:?}");
    }

    #[test]
    fn every_lock_kind_has_its_label_in_the_table() {
        let semaphore = LockKind::Semaphore {
            permits: 2,
            take: 1,
        };
        let every = [
            LockKind::Exclusive,
            LockKind::Fair,
            LockKind::Read,
            LockKind::Write,
            semaphore,
        ];
        for kind in every {
            match kind {
                LockKind::Exclusive
                | LockKind::Fair
                | LockKind::Read
                | LockKind::Write
                | LockKind::Semaphore { .. } => {}
            }
            assert!(KINDS.contains(&kind_label(kind)), "{kind:?}");
        }
    }

    #[test]
    fn every_outcome_an_acquisition_can_have_is_in_the_table() {
        let mut outcomes: HashSet<&str> = [
            outcome_of::<()>(Ok(Some(&()))),
            outcome_of::<()>(Ok(None)),
            "cancelled",
        ]
        .into();
        for kind in every_error_kind() {
            outcomes.insert(outcome_of::<()>(Err(&LockError::new(kind, ""))));
        }
        assert_eq!(outcomes, OUTCOMES.into());
        same_set(OUTCOMES, &OUTCOMES);
    }

    #[test]
    fn every_redis_error_kind_has_its_label_in_the_table() {
        let labels: HashSet<&str> = every_error_kind()
            .into_iter()
            .map(redis_error_label)
            .collect();
        assert_eq!(labels, REDIS_ERROR_KINDS.into());
        same_set(REDIS_ERROR_KINDS, &REDIS_ERROR_KINDS);
    }

    #[test]
    fn every_lost_reason_is_in_the_table() {
        let every = [
            LostReason::Expired,
            LostReason::Taken,
            LostReason::Unreachable,
            LostReason::ShutDown,
            LostReason::DataLost,
        ];
        for reason in every {
            match reason {
                LostReason::Expired
                | LostReason::Taken
                | LostReason::Unreachable
                | LostReason::ShutDown
                | LostReason::DataLost => {}
            }
        }
        same_set(LOST_REASONS.map(lost_label), &every.map(lost_label));
    }

    #[test]
    fn every_hand_over_path_and_renewal_is_in_its_table() {
        let every = [HandoverPath::Local, HandoverPath::Redis];
        for path in every {
            match path {
                HandoverPath::Local | HandoverPath::Redis => {}
            }
        }
        same_set(
            HandoverPath::ALL.map(HandoverPath::as_str),
            &every.map(HandoverPath::as_str),
        );
        let every = [Renewal::Renewed, Renewal::Taken, Renewal::Failed];
        for renewal in every {
            match renewal {
                Renewal::Renewed | Renewal::Taken | Renewal::Failed => {}
            }
        }
        same_set(
            Renewal::ALL.map(Renewal::as_str),
            &every.map(Renewal::as_str),
        );
    }

    #[test]
    fn every_idempotent_outcome_is_in_the_table() {
        use IdempotentOutcome::*;
        let every = [
            First,
            Replayed,
            Mismatch,
            InProgress,
            NotStored,
            OverBound,
            Refused,
            LeaseLost,
            StoreFailed,
            Unguarded,
            NoKey,
            Rejected,
            OutcomeUnknown,
        ];
        for outcome in every {
            match outcome {
                First | Replayed | Mismatch | InProgress | NotStored | OverBound | Refused
                | LeaseLost | StoreFailed | Unguarded | NoKey | Rejected | OutcomeUnknown => {}
            }
        }
        same_set(
            IdempotentOutcome::ALL.map(IdempotentOutcome::as_str),
            &every.map(IdempotentOutcome::as_str),
        );
    }

    /// Every error kind; a new kind fails to compile in the match until it is listed.
    fn every_error_kind() -> [ErrorKind; 15] {
        let every = [
            ErrorKind::Timeout,
            ErrorKind::RedisUnavailable,
            ErrorKind::Redis,
            ErrorKind::NotOwner,
            ErrorKind::InvalidName,
            ErrorKind::InvalidConfig,
            ErrorKind::ShutDown,
            ErrorKind::AccessDenied,
            ErrorKind::QuorumUnreachable,
            ErrorKind::RestartQuarantine,
            ErrorKind::ReplicasBehind,
            ErrorKind::PermitsMismatch,
            ErrorKind::WrongSlot,
            ErrorKind::UnsupportedGuard,
            ErrorKind::AlreadyCommitted,
        ];
        for kind in every {
            match kind {
                ErrorKind::Timeout
                | ErrorKind::RedisUnavailable
                | ErrorKind::Redis
                | ErrorKind::NotOwner
                | ErrorKind::InvalidName
                | ErrorKind::InvalidConfig
                | ErrorKind::ShutDown
                | ErrorKind::AccessDenied
                | ErrorKind::QuorumUnreachable
                | ErrorKind::RestartQuarantine
                | ErrorKind::ReplicasBehind
                | ErrorKind::PermitsMismatch
                | ErrorKind::WrongSlot
                | ErrorKind::UnsupportedGuard
                | ErrorKind::AlreadyCommitted => {}
            }
        }
        every
    }
}
