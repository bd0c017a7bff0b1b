//! `IdempotencyContext`: what a handler behind the idempotency layer knows of its key, and
//! the one step that commits its effect with the key's outcome.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;

use super::record::committed_writes;
use crate::error::{ErrorKind, LockError, Result};
use crate::guarded_write::GuardedWrites;
use crate::layer::held::HeldWrites;

/// The idempotency key a request runs under, in its extensions
/// (`Extension<IdempotencyContext>` in axum, `request.extensions().get::<IdempotencyContext>()`
/// in tonic), for a handler whose effect must happen once.
///
/// - **Data in Redis:** [`IdempotencyContext::commit`] applies the handler's writes and
///   keeps its outcome under the key in one script, only while the key's lock is this
///   request's: no retry can find the effect without its outcome, nor the outcome without
///   its effect. A retry that finds the outcome committed runs the handler with
///   [`IdempotencyContext::committed`] set, and the handler answers from it, making no
///   effect again (a second `commit` is refused).
/// - **Data elsewhere (SQL):** record [`IdempotencyContext::key`] and
///   [`IdempotencyContext::fingerprint`] in the handler's own transaction, under a unique
///   constraint, and answer from that row when it is there already.
///
/// Either way, let a retry of an attempt whose outcome is unknown run again
/// ([`OnUnknownOutcome::RunAgain`](super::OnUnknownOutcome::RunAgain)): the handler itself
/// then keeps the effect to once.
#[derive(Debug, Clone)]
pub struct IdempotencyContext {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    parts: ContextParts,
    /// Whether this request sent its commit.
    committed: AtomicBool,
}

/// What the flow knows when it hands a request to its handler.
#[derive(Debug)]
pub(crate) struct ContextParts {
    pub(crate) key: String,
    pub(crate) scope: Vec<String>,
    pub(crate) fingerprint: String,
    pub(crate) hash_tag: String,
    pub(crate) record_key: String,
    pub(crate) ttl: Duration,
    /// The outcome an earlier attempt committed, if one did.
    pub(crate) earlier: Option<Bytes>,
    pub(crate) writes: HeldWrites,
}

impl IdempotencyContext {
    pub(crate) fn new(parts: ContextParts) -> Self {
        Self {
            inner: Arc::new(Inner {
                parts,
                committed: AtomicBool::new(false),
            }),
        }
    }

    /// The request's idempotency key, as the client sent it (unquoted).
    pub fn key(&self) -> &str {
        &self.inner.parts.key
    }

    /// The key's scope, as the layer's scope extractor read it (the tenant, say).
    pub fn scope(&self) -> &[String] {
        &self.inner.parts.scope
    }

    /// The request's fingerprint (hex SHA-256 of its method, path and query, and body): a
    /// retry with the same key carries the same one.
    pub fn fingerprint(&self) -> &str {
        &self.inner.parts.fingerprint
    }

    /// The cluster hash tag of the key's record, `{<escaped lock name>}`: on a Redis Cluster
    /// every key [`IdempotencyContext::commit`] writes must carry it
    /// (`format!("payment:{}", context.hash_tag())`); on one server any key may be written.
    pub fn hash_tag(&self) -> &str {
        &self.inner.parts.hash_tag
    }

    /// The outcome an earlier attempt with this key committed, if one did: its effect is
    /// made, so answer from it and make none again.
    pub fn committed(&self) -> Option<&Bytes> {
        self.inner.parts.earlier.as_ref()
    }

    /// Applies `writes` and keeps `outcome` (what the answer is built from: its body, say)
    /// as the key's committed outcome, in one Redis script, only while the key's lock is
    /// this request's: `Ok(true)` both done, `Ok(false)` the lock was lost (the instance
    /// paused past its lease, say) and nothing was written. After `Ok(false)`, do not answer
    /// as if the effect were made: another attempt may make it.
    ///
    /// A retry that finds the outcome committed while no response is stored (this
    /// instance stopped before the layer stored it) runs the handler with
    /// [`IdempotencyContext::committed`] set, never to make the effect again.
    ///
    /// # Cancel safety
    ///
    /// The script runs to its answer whether or not the caller waits for it, and the layer
    /// waits for that answer before it releases the key's lock.
    ///
    /// # Errors
    ///
    /// Before anything is sent:
    /// [`ErrorKind::AlreadyCommitted`](crate::ErrorKind::AlreadyCommitted) when this request
    /// tried to commit before (whatever that call returned) or an earlier attempt committed,
    /// and as
    /// [`LockGuard::write_if_held`](crate::LockGuard::write_if_held) otherwise:
    /// [`ErrorKind::WrongSlot`](crate::ErrorKind::WrongSlot) on a cluster for a key without
    /// the record's [hash tag](IdempotencyContext::hash_tag),
    /// [`ErrorKind::RedisUnavailable`](crate::ErrorKind::RedisUnavailable) when Redis did not
    /// answer (the commit may or may not have landed: a retry of the key finds which).
    pub async fn commit(&self, writes: GuardedWrites, outcome: impl Into<Bytes>) -> Result<bool> {
        let (parts, committed) = (&self.inner.parts, &self.inner.committed);
        if parts.earlier.is_some() || committed.swap(true, Ordering::SeqCst) {
            return Err(LockError::new(
                ErrorKind::AlreadyCommitted,
                "the outcome of this idempotency key was committed already: answer from it",
            ));
        }
        let outcome = outcome.into();
        let record = committed_writes(&parts.record_key, &parts.fingerprint, &outcome, parts.ttl);
        // Once sent it is never sent again, whatever came back: a commit whose answer did not
        // come may have landed, and a retry of the key reads the record to learn which.
        parts.writes.write_if_held(None, &writes.then(record)).await
    }

    /// Whether this request sent a commit (which may have landed).
    pub(crate) fn has_committed(&self) -> bool {
        self.inner.committed.load(Ordering::SeqCst)
    }

    /// Whether the key's outcome is committed, or may be: by this request, or by an earlier
    /// attempt this one answers from. Its record then stays, whatever this request answers.
    pub(crate) fn outcome_committed(&self) -> bool {
        self.has_committed() || self.inner.parts.earlier.is_some()
    }
}
