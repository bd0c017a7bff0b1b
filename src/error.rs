//! The crate's one error type: opaque, with a [`ErrorKind`] to match on.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

/// What went wrong, for callers that branch on the cause.
///
/// New kinds may be added in minor releases, so matches need a wildcard arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The wait bound passed before the lock could be acquired.
    Timeout,
    /// Redis could not be reached, or did not answer within the command timeout.
    RedisUnavailable,
    /// Redis answered with an error (a script failure, a wrong type).
    Redis,
    /// The lock is no longer held by this guard: its lease ran out or it was force-unlocked.
    NotOwner,
    /// The lock name is empty, too long, or the key prefix is unusable; or a guarded write
    /// ([`LockGuard::write_if_held`](crate::LockGuard::write_if_held)) names one of the
    /// library's own keys (a lock's hash, queue or fence, an epoch, a token counter), which
    /// only its scripts may write. Nothing was sent.
    InvalidName,
    /// The client configuration (URL, durations), or the shape of a lock kind (a segment
    /// count, a set of quorum servers), is unusable.
    InvalidConfig,
    /// The client was shut down.
    ShutDown,
    /// Redis refused this client: a wrong password or user (`WRONGPASS`, `NOAUTH`), an ACL
    /// that does not allow a command, key or channel the library uses (`NOPERM`, also from
    /// inside its scripts), or a TLS handshake that failed on a certificate (the server's is
    /// not trusted, or the client's was refused). Retrying does not help until the
    /// configuration changes, so the layer never fails open on it.
    AccessDenied,
    /// A quorum lock ([`RedLock`](crate::RedLock)) could not reach a quorum because too many
    /// of its servers were unreachable or did not answer within the attempt bound, so the
    /// servers that did answer could never make a majority. Not a [`Self::Timeout`]: waiting
    /// longer does not help until servers come back.
    QuorumUnreachable,
    /// The wait bound passed during a restart quarantine: Redis lost its data (a restart
    /// without persistence, a failover to an empty replica, a flush) and grants no lock until
    /// every holder of a lost lock has been told
    /// ([`LockClientBuilder::lease_limit`](crate::LockClientBuilder::lease_limit)).
    /// Retry once it ends ([`LockClient::restart_quarantine_left`](crate::LockClient::restart_quarantine_left)).
    RestartQuarantine,
    /// Fewer replicas than
    /// [`LockClientBuilder::min_replicas_acked`](crate::LockClientBuilder::min_replicas_acked)
    /// asks for acknowledged the acquisition in time: it was released, as a failover could
    /// have lost it. Retry once the replicas catch up. After a guarded write
    /// ([`LockGuard::write_if_held`](crate::LockGuard::write_if_held)): the writes were
    /// applied on the master, but a failover could still lose them.
    ReplicasBehind,
    /// A [`Semaphore`](crate::Semaphore) is held in Redis with another permit count than the
    /// one this client asked with: two clients disagree on it. Nothing was taken or queued;
    /// the count in Redis stands until nobody holds the semaphore.
    PermitsMismatch,
    /// A guarded write ([`LockGuard::write_if_held`](crate::LockGuard::write_if_held)) on a
    /// Redis Cluster names a key outside the lock's slot, where no script of the lock can
    /// reach it. Nothing was sent: put the lock's hash tag
    /// ([`LockGuard::hash_tag`](crate::LockGuard::hash_tag)) in the key.
    WrongSlot,
    /// The guard cannot do what was asked of it: a guarded write
    /// ([`LockGuard::write_if_held`](crate::LockGuard::write_if_held)) by a read guard or a
    /// semaphore's permit, which others hold beside it. Nothing was sent.
    UnsupportedGuard,
    /// An idempotent request's outcome was committed already
    /// ([`IdempotencyContext::commit`](crate::idempotency::IdempotencyContext::commit)), by
    /// this run or by an earlier attempt with the same key: its effect must not be made
    /// again. Nothing was sent.
    AlreadyCommitted,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Timeout => "timed out waiting for the lock",
            Self::RedisUnavailable => "redis unavailable",
            Self::Redis => "redis error",
            Self::NotOwner => "lock not held by this owner",
            Self::InvalidName => "invalid lock name",
            Self::InvalidConfig => "invalid configuration",
            Self::ShutDown => "lock client shut down",
            Self::AccessDenied => "access denied by redis",
            Self::QuorumUnreachable => "quorum of redis servers unreachable",
            Self::RestartQuarantine => "no lock granted during the restart quarantine",
            Self::ReplicasBehind => "too few replicas acknowledged the acquisition",
            Self::PermitsMismatch => "the semaphore is held with another permit count",
            Self::WrongSlot => "a key outside the lock's cluster slot",
            Self::UnsupportedGuard => "not supported by this kind of guard",
            Self::AlreadyCommitted => "the idempotent request's outcome was committed already",
        })
    }
}

/// An error from this crate. Match on [`LockError::kind`]; the source, when there is one,
/// carries the underlying cause for logs.
pub struct LockError {
    kind: ErrorKind,
    detail: String,
    source: Option<Box<dyn StdError + Send + Sync>>,
    /// When retrying can first succeed, where Redis told it (a restart quarantine's end).
    retry_after: Option<Duration>,
}

/// Short for `Result<T, LockError>`.
pub type Result<T, E = LockError> = std::result::Result<T, E>;

impl LockError {
    pub(crate) fn new(kind: ErrorKind, detail: impl Into<String>) -> Self {
        Self {
            kind,
            detail: detail.into(),
            source: None,
            retry_after: None,
        }
    }

    pub(crate) fn with_source(
        kind: ErrorKind,
        detail: impl Into<String>,
        source: impl StdError + Send + Sync + 'static,
    ) -> Self {
        Self {
            kind,
            detail: detail.into(),
            source: Some(Box::new(source)),
            retry_after: None,
        }
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// Whether this is a [`ErrorKind::Timeout`].
    pub fn is_timeout(&self) -> bool {
        self.kind == ErrorKind::Timeout
    }

    pub(crate) fn timeout(what: &str) -> Self {
        Self::new(ErrorKind::Timeout, what)
    }

    /// How long to wait before retrying can succeed, when Redis told it: the time left of a
    /// restart quarantine ([`ErrorKind::RestartQuarantine`]). The layer's `Retry-After`.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// A wait bound that passed, or could not outlast, a restart quarantine (`left` more)
    /// that keeps every lock of the Redis from being granted.
    pub(crate) fn restart_quarantine(what: &str, left: Duration) -> Self {
        Self {
            retry_after: Some(left),
            ..Self::new(
                ErrorKind::RestartQuarantine,
                // A new server reads the same as one that restarted empty: say both, and
                // how an operator who knows it is new ends the wait.
                format!(
                    "{what}: Redis lost its data, or started less than the lease limit ago \
                     (a new server looks the same); the quarantine ends in {}ms \
                     (`lockctl waive-quarantine` ends it on a server known to be new)",
                    left.as_millis()
                ),
            )
        }
    }

    /// The same error for one more caller of a call that failed for several (a Redis error
    /// as its source is kept, and with it whether the connection broke).
    pub(crate) fn for_another(&self) -> Self {
        let source = self
            .source
            .as_deref()
            .and_then(|source| source.downcast_ref::<redis::RedisError>())
            .map(|err| Box::new(err.clone()) as Box<dyn StdError + Send + Sync>);
        Self {
            kind: self.kind,
            detail: self.detail.clone(),
            source,
            retry_after: self.retry_after,
        }
    }

    pub(crate) fn command_timeout() -> Self {
        Self::new(
            ErrorKind::RedisUnavailable,
            "no answer from redis within the command timeout",
        )
    }

    /// Whether the connection broke under the command (rather than timing out): the
    /// command ran before the break or never will, so it may be sent again on a fresh one.
    pub(crate) fn is_connection_broken(&self) -> bool {
        self.source
            .as_deref()
            .and_then(|source| source.downcast_ref::<redis::RedisError>())
            .is_some_and(|err| err.is_connection_dropped() || err.is_io_error())
    }

    pub(crate) fn shut_down() -> Self {
        Self::new(ErrorKind::ShutDown, "the lock client was shut down")
    }
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.detail.is_empty() {
            write!(f, "{}", self.kind)
        } else {
            write!(f, "{}: {}", self.kind, self.detail)
        }
    }
}

impl fmt::Debug for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockError")
            .field("kind", &self.kind)
            .field("detail", &self.detail)
            .finish()
    }
}

impl StdError for LockError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|source| source as &(dyn StdError + 'static))
    }
}
