//! One idempotent request, step by step: fingerprint it, answer from the store if its key
//! has a response, else take the key's lock, look again (the first may have finished while
//! this one waited), mark the key started, run it, and store its response with a write only
//! the lock's holder can make. A key found started with no outcome is an earlier attempt
//! that ended without one: refused or run again, as the settings say.

use std::future::poll_fn;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, response};
use tower::Service;

use super::context::{ContextParts, IdempotencyContext};
use super::fingerprint::fingerprint;
use super::record::{
    IdempotencyRecords, KeyRecord, StoredResponse, read, record_key, started_writes,
};
use super::replay_body::ReplayableBody;
use super::settings::{OnUnknownOutcome, REPLAYED_HEADER, Settings};
use super::storable::storable;
use crate::error::{ErrorKind, LockError};
use crate::guard::LostSignal;
use crate::guarded_write::GuardedWrites;
use crate::layer::answer::answer;
use crate::layer::buffer::{
    Captured, ReadBody, ReadError, Reading, capture, declared_over, request_bytes,
};
use crate::layer::held::HeldGuards;
use crate::layer::log::LayerLog;
use crate::layer::{BufferedBody, OnRedisUnavailable, Reject, Rejection, RejectionKind};
use crate::lock::Lock;
use crate::meter::{self, IdempotentOutcome};

/// What a request with a usable key needs for its flow.
pub(crate) struct Flow<R> {
    pub(crate) records: IdempotencyRecords,
    pub(crate) scope: Vec<String>,
    pub(crate) key: String,
    pub(crate) reject: R,
    pub(crate) settings: Arc<Settings>,
    pub(crate) log: Arc<LayerLog>,
    pub(crate) grpc: bool,
}

/// An answer ready now, as the service's future.
pub(crate) fn answer_now<T: Send + 'static, E: Send + 'static>(
    answer: T,
) -> super::future::ResponseFuture<T, E> {
    super::future::ResponseFuture::new(std::future::ready(Ok(answer)))
}

/// A body's error, boxed, as `ReadBody` reads it.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Where a flow stands after a step: go on with `T`, or answer now.
type Step<T, ResB, E> = Result<T, Result<Response<ResB>, E>>;

/// Runs `request` on `inner` as if the layer were not there.
pub(crate) async fn run_unguarded<S: Service<Request<ReqB>>, ReqB>(
    mut inner: S,
    request: Request<ReqB>,
) -> Result<S::Response, S::Error> {
    poll_fn(|cx| inner.poll_ready(cx)).await?;
    inner.call(request).await
}

impl<R> Flow<R> {
    /// The whole flow of one request with a usable key.
    pub(crate) async fn run<S, ReqB, ResB>(
        self,
        inner: S,
        request: Request<ReqB>,
    ) -> Result<Response<ResB>, S::Error>
    where
        S: Service<Request<ReqB>, Response = Response<ResB>>,
        R: Reject<ResB>,
        ReqB: ReplayableBody,
        ReqB::Error: Into<BoxError>,
        ResB: ReplayableBody + Unpin,
    {
        let (request, fingerprint) = match self.read_request(request).await {
            Ok(read) => read,
            Err(answer) => return answer,
        };
        let lock = match self.records.lock(&self.scope, &self.key) {
            Ok(lock) => {
                self.records.check_durability(&lock);
                lock.with_lease(self.settings.lease)
            }
            Err(error) => {
                let detail = format!("the idempotency key makes no lock name: {error}");
                return self.rejected(RejectionKind::InvalidIdempotencyKey, detail);
            }
        };
        let locked = match self.look_then_lock(&lock, &fingerprint).await {
            Ok(locked) => locked,
            Err(LookedUp::Answer(answer)) => return answer,
            Err(LookedUp::Unavailable(error)) => {
                return self.unavailable(&error, inner, request).await;
            }
        };
        self.run_first(inner, request, fingerprint, &lock, locked)
            .await
    }

    /// Reads the request's body whole (up to the bound; a length declared over it is refused
    /// before a byte is read), fingerprints the request, and hands the bytes on in the body
    /// and in the extensions ([`BufferedBody`]).
    async fn read_request<ReqB, ResB, E>(
        &self,
        request: Request<ReqB>,
    ) -> Step<(Request<ReqB>, String), ResB, E>
    where
        R: Reject<ResB>,
        ReqB: ReplayableBody,
        ReqB::Error: Into<BoxError>,
    {
        let bound = self.settings.max_request_body;
        if declared_over(&request, bound).is_some() {
            let detail = format!("over the limit of {bound} bytes for an idempotent request");
            return Err(self.rejected(RejectionKind::BodyTooLarge, detail));
        }
        let (mut parts, body) = request.into_parts();
        match request_bytes(ReadBody::new(body, bound).await, bound) {
            Ok(data) => {
                let fingerprint = fingerprint(&parts, &data, self.settings.body_comparison);
                parts.extensions.insert(BufferedBody::new(data.clone()));
                let request = Request::from_parts(parts, ReqB::replay(data, None));
                Ok((request, fingerprint))
            }
            Err(ReadError::TooLarge(_)) => {
                let detail = format!("over the limit of {bound} bytes for an idempotent request");
                Err(self.rejected(RejectionKind::BodyTooLarge, detail))
            }
            Err(failed @ ReadError::Failed(_)) => {
                Err(self.rejected(RejectionKind::BodyUnreadable, failed.to_string()))
            }
        }
    }

    /// Answers from the store, or takes the key's lock and looks once more; the stored
    /// response is read before the lock so that a late duplicate never waits. A key found
    /// with no record is marked started before its handler runs.
    async fn look_then_lock<ResB, E>(
        &self,
        lock: &Lock,
        fingerprint: &str,
    ) -> Result<Locked, LookedUp<ResB, E>>
    where
        R: Reject<ResB>,
        ResB: ReplayableBody,
    {
        match read(lock).await.map_err(LookedUp::Unavailable)? {
            Some(KeyRecord::Answered(stored)) => {
                return Err(LookedUp::Answer(self.answer_stored(&stored, fingerprint)));
            }
            Some(started) if started.fingerprint() != fingerprint => {
                return Err(LookedUp::Answer(self.mismatch()));
            }
            // Started: it runs still (wait for its lock) or ended without an outcome.
            _ => {}
        }
        let guard = match lock.acquire_timeout(self.settings.wait).await {
            Ok(guard) => guard,
            Err(error) if error.kind() == ErrorKind::Timeout => {
                meter::idempotent(IdempotentOutcome::InProgress);
                let detail = format!("waited {:?} for the first request", self.settings.wait);
                return Err(LookedUp::Answer(Ok(
                    self.rejection(RejectionKind::IdempotencyInProgress, detail)
                )));
            }
            Err(error) => return Err(LookedUp::Unavailable(error)),
        };
        let lost = guard.lost_signal();
        let held = HeldGuards::new(vec![guard]);
        let earlier = match read(lock).await.map_err(LookedUp::Unavailable)? {
            None => {
                let mark = started_writes(&record_key(lock), fingerprint, self.settings.ttl);
                match held.writes().write_if_held(None, &mark).await {
                    Ok(true) => None,
                    Ok(false) => return Err(LookedUp::Answer(Ok(self.lease_lost_before_run()))),
                    Err(error) => return Err(LookedUp::Unavailable(error)),
                }
            }
            Some(KeyRecord::Answered(stored)) => {
                return Err(LookedUp::Answer(self.answer_stored(&stored, fingerprint)));
            }
            Some(started) if started.fingerprint() != fingerprint => {
                return Err(LookedUp::Answer(self.mismatch()));
            }
            Some(KeyRecord::Started {
                committed: Some(outcome),
                ..
            }) => Some(outcome),
            Some(KeyRecord::Started { .. }) => match self.settings.unknown_outcome {
                OnUnknownOutcome::RunAgain => None,
                OnUnknownOutcome::Refuse => return Err(LookedUp::Answer(self.unknown_outcome())),
            },
        };
        Ok(Locked {
            held,
            lost,
            earlier,
        })
    }

    /// Runs the first request for the key under its lock, with its [`IdempotencyContext`],
    /// and stores its response.
    async fn run_first<S, ReqB, ResB>(
        &self,
        inner: S,
        mut request: Request<ReqB>,
        fingerprint: String,
        lock: &Lock,
        locked: Locked,
    ) -> Result<Response<ResB>, S::Error>
    where
        S: Service<Request<ReqB>, Response = Response<ResB>>,
        R: Reject<ResB>,
        ResB: ReplayableBody + Unpin,
    {
        let Locked {
            held,
            lost,
            earlier,
        } = locked;
        let context = IdempotencyContext::new(ContextParts {
            key: self.key.clone(),
            scope: self.scope.clone(),
            fingerprint: fingerprint.clone(),
            hash_tag: lock.keys().hash_tag().to_owned(),
            record_key: record_key(lock),
            ttl: self.settings.ttl,
            earlier,
            writes: held.writes(),
        });
        request.extensions_mut().insert(context.clone());
        let handler = run_unguarded(inner, request);
        tokio::pin!(handler);
        let ran = tokio::select! {
            response = &mut handler => Ok(response),
            reason = lost.lost() => Err(reason),
        };
        let response = match ran {
            Ok(response) => response?,
            // Its effect is committed (or its commit refused): all that is left is its
            // answer, which only it can build.
            Err(_) if context.has_committed() => handler.await?,
            Err(reason) => {
                meter::idempotent(IdempotentOutcome::LeaseLost);
                let detail = format!("the lock lease was lost ({reason:?}) while the handler ran");
                return Ok(self.rejection(RejectionKind::LeaseLost, detail));
            }
        };
        let (parts, body) = response.into_parts();
        if !storable(
            parts.status,
            &parts.headers,
            None,
            self.settings.stored_answers,
        ) {
            meter::idempotent(IdempotentOutcome::NotStored);
            self.forget_start(&held, &context, lock).await;
            return Ok(Response::from_parts(parts, body));
        }
        let captured = match capture(body, self.settings.max_stored_body).await {
            Ok(captured) => captured,
            Err(_) => {
                meter::idempotent(IdempotentOutcome::NotStored);
                tracing::warn!(key = %self.key, "the response body failed while it was read to store it; nothing stored");
                let mut broken = Response::new(ResB::replay(Bytes::new(), None));
                *broken.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                return Ok(broken);
            }
        };
        self.store(parts, captured, fingerprint, lock, &held, &context)
            .await
    }

    /// A handler that answered that it did not do its work (a server error, 429) and
    /// committed nothing leaves its key new again, while its lock is still held: its retry
    /// runs. Anything else keeps the mark, and a retry finds the outcome unknown.
    async fn forget_start(&self, held: &HeldGuards, context: &IdempotencyContext, lock: &Lock) {
        if context.outcome_committed() {
            return;
        }
        let forget = GuardedWrites::new().del(&record_key(lock));
        if let Err(error) = held.writes().write_if_held(None, &forget).await {
            tracing::warn!(key = %self.key, %error, "the start of a request that did not do its work could not be forgotten: its retry finds the outcome unknown");
        }
    }

    /// Stores a response whose body was read (or found over the bound), then answers it.
    async fn store<ResB, E>(
        &self,
        parts: response::Parts,
        captured: Captured<ResB>,
        fingerprint: String,
        lock: &Lock,
        held: &HeldGuards,
        context: &IdempotencyContext,
    ) -> Result<Response<ResB>, E>
    where
        R: Reject<ResB>,
        ResB: ReplayableBody,
    {
        let (kept, body, outcome) = match captured {
            Reading::Whole { data, trailers } => {
                if !storable(
                    parts.status,
                    &parts.headers,
                    trailers.as_ref(),
                    self.settings.stored_answers,
                ) {
                    meter::idempotent(IdempotentOutcome::NotStored);
                    self.forget_start(held, context, lock).await;
                    return Ok(Response::from_parts(parts, ResB::replay(data, trailers)));
                }
                let body = ResB::replay(data.clone(), trailers.clone());
                (Some((data, trailers)), body, IdempotentOutcome::First)
            }
            Reading::Over((read, rest)) => {
                (None, ResB::resume(read, rest), IdempotentOutcome::OverBound)
            }
        };
        let headers = kept_headers(&parts.headers, &self.settings);
        let (data, trailers) = kept.map_or((None, None), |(data, trailers)| (Some(data), trailers));
        let stored = StoredResponse::new(fingerprint, parts.status, headers, trailers, data);
        let writes = stored.writes(&record_key(lock), self.settings.ttl);
        match held.writes().write_if_held(None, &writes).await {
            Ok(true) => {
                if outcome == IdempotentOutcome::OverBound {
                    tracing::error!(key = %self.key, bound = self.settings.max_stored_body, "a response over the store's bound ran and was not kept: its duplicates are answered 500");
                }
                meter::idempotent(outcome);
                Ok(Response::from_parts(parts, body))
            }
            Ok(false) if context.outcome_committed() => {
                meter::idempotent(IdempotentOutcome::Refused);
                tracing::warn!(key = %self.key, "the lock was lost before the response was stored: the handler's committed outcome stands, and its retries are answered from it");
                Ok(Response::from_parts(parts, body))
            }
            Ok(false) => {
                meter::idempotent(IdempotentOutcome::Refused);
                tracing::warn!(key = %self.key, "the lock was lost before the response was stored: not stored, answered as a lost lease");
                let detail = "the lock lease was lost before the response was stored".to_owned();
                Ok(self.rejection(RejectionKind::LeaseLost, detail))
            }
            Err(error) => {
                meter::idempotent(IdempotentOutcome::StoreFailed);
                tracing::warn!(key = %self.key, %error, "the response may not have been stored (the store timed out or failed); a duplicate may run again");
                Ok(Response::from_parts(parts, body))
            }
        }
    }

    /// The answer to a duplicate: the stored response, or why it cannot have it.
    fn answer_stored<ResB, E>(
        &self,
        stored: &StoredResponse,
        fingerprint: &str,
    ) -> Result<Response<ResB>, E>
    where
        R: Reject<ResB>,
        ResB: ReplayableBody,
    {
        if stored.fingerprint() != fingerprint {
            return self.mismatch();
        }
        let Some(body) = stored.body() else {
            meter::idempotent(IdempotentOutcome::Rejected);
            let detail = "the first response was over the store's bound".to_owned();
            return Ok(self.rejection(RejectionKind::ResponseNotStored, detail));
        };
        meter::idempotent(IdempotentOutcome::Replayed);
        let mut response = Response::new(ResB::replay(body.clone(), stored.trailers().cloned()));
        *response.status_mut() = stored.status();
        *response.headers_mut() = stored.headers().clone();
        response
            .headers_mut()
            .insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
        Ok(response)
    }

    /// The answer to a key first used with another request: 422.
    fn mismatch<ResB, E>(&self) -> Result<Response<ResB>, E>
    where
        R: Reject<ResB>,
    {
        meter::idempotent(IdempotentOutcome::Mismatch);
        let detail = "the key was first used with another request".to_owned();
        Ok(self.rejection(RejectionKind::IdempotencyKeyReused, detail))
    }

    /// The answer to a key whose earlier attempt ended without an outcome, at most once.
    fn unknown_outcome<ResB, E>(&self) -> Result<Response<ResB>, E>
    where
        R: Reject<ResB>,
    {
        meter::idempotent(IdempotentOutcome::OutcomeUnknown);
        tracing::warn!(key = %self.key, "an earlier attempt with this key started and ended without an outcome: not run again");
        let detail = "an earlier attempt started and ended without an outcome".to_owned();
        Ok(self.rejection(RejectionKind::IdempotencyOutcomeUnknown, detail))
    }

    /// The answer when the key's lock was lost before its handler started: nothing ran.
    fn lease_lost_before_run<ResB>(&self) -> Response<ResB>
    where
        R: Reject<ResB>,
    {
        meter::idempotent(IdempotentOutcome::LeaseLost);
        let detail = "the lock lease was lost before the handler started".to_owned();
        self.rejection(RejectionKind::LeaseLost, detail)
    }

    /// Redis could not be reached for the store or the lock: the policy's answer.
    async fn unavailable<S, ReqB, ResB>(
        &self,
        error: &LockError,
        inner: S,
        request: Request<ReqB>,
    ) -> Result<Response<ResB>, S::Error>
    where
        S: Service<Request<ReqB>, Response = Response<ResB>>,
        R: Reject<ResB>,
    {
        match self.settings.redis_unavailable {
            OnRedisUnavailable::FailOpen if is_unreachable(error) => {
                meter::idempotent(IdempotentOutcome::Unguarded);
                tracing::warn!(key = %self.key, %error, "Redis unreachable: the request runs without its idempotency key");
                run_unguarded(inner, request).await
            }
            _ => {
                meter::idempotent(IdempotentOutcome::Rejected);
                let rejection =
                    Rejection::from_error(error, self.grpc, Vec::new(), self.settings.retry_after);
                Ok(answer(&rejection, &self.reject, &self.log))
            }
        }
    }

    fn rejection<ResB>(&self, kind: RejectionKind, detail: String) -> Response<ResB>
    where
        R: Reject<ResB>,
    {
        let rejection = Rejection::new(
            kind,
            self.grpc,
            Vec::new(),
            detail,
            self.settings.retry_after,
        );
        answer(&rejection, &self.reject, &self.log)
    }

    fn rejected<ResB, E>(&self, kind: RejectionKind, detail: String) -> Result<Response<ResB>, E>
    where
        R: Reject<ResB>,
    {
        meter::idempotent(IdempotentOutcome::Rejected);
        Ok(self.rejection(kind, detail))
    }
}

/// The key's lock, held for a request that runs: the guard behind the handler's writes,
/// its lost signal, and the outcome an earlier attempt committed, if one did.
struct Locked {
    held: HeldGuards,
    lost: LostSignal,
    earlier: Option<Bytes>,
}

/// Why a look in the store did not end in a held lock.
enum LookedUp<ResB, E> {
    /// The duplicate's answer.
    Answer(Result<Response<ResB>, E>),
    /// Redis failed.
    Unavailable(LockError),
}

/// Whether a failure is Redis being out of reach, the one a fail-open policy runs through.
fn is_unreachable(error: &LockError) -> bool {
    matches!(error.kind(), ErrorKind::RedisUnavailable | ErrorKind::Redis)
}

/// The response headers the settings keep.
fn kept_headers(headers: &HeaderMap, settings: &Settings) -> HeaderMap {
    let mut kept = HeaderMap::new();
    for name in &settings.stored_headers {
        for value in headers.get_all(name) {
            kept.append(name, value.clone());
        }
    }
    kept
}
