//! The response future: acquiring → running the inner future with the guards held →
//! done. The guards are fields, so whatever ends or drops the future releases the locks.
//!
//! The release is off the request path: the response is returned as soon as the inner
//! future is, and dropping the guards either hands each lock to the next request of this
//! process that waits for it (no round trip) or releases it in a background task. A later
//! request for the same key in this process cannot get ahead of that release: the key's
//! local turn stays with the released guard until Redis has confirmed.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use futures_util::future::BoxFuture;
use http::{Request, Response};
use pin_project::pin_project;
use tokio::time::Instant;
use tower::Service;

use super::context::LockContext;
use super::policy::{OnLeaseLost, OnRedisUnavailable, Policy};
use super::reject::{Reject, Rejection, is_grpc};
use crate::client::LockClient;
use crate::error::{ErrorKind, LockError};
use crate::guard::{LockGuard, LostReason};
use crate::kind::LockKind;

/// The future of [`LockService`](super::LockService).
#[pin_project]
pub struct ResponseFuture<S, ReqB, R>
where
    S: Service<Request<ReqB>>,
{
    #[pin]
    state: State<S, ReqB>,
    reject: R,
    policy: Arc<Policy>,
    /// The lock names asked for, and whether the request is gRPC: what a rejection says.
    names: Vec<String>,
    grpc: bool,
    span: tracing::Span,
}

impl<S, ReqB, R> std::fmt::Debug for ResponseFuture<S, ReqB, R>
where
    S: Service<Request<ReqB>>,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("names", &self.names)
            .finish_non_exhaustive()
    }
}

#[pin_project(project = StateProj)]
enum State<S, ReqB>
where
    S: Service<Request<ReqB>>,
{
    Acquiring {
        acquire: BoxFuture<
            'static,
            Result<Result<Vec<LockGuard>, LockError>, tokio::time::error::Elapsed>,
        >,
        service: Option<S>,
        request: Option<Request<ReqB>>,
        started: Instant,
    },
    Running {
        #[pin]
        future: S::Future,
        lost: Option<BoxFuture<'static, LostReason>>,
        // Held, never read: dropping the state releases the locks.
        guards: Vec<LockGuard>,
    },
    Rejected {
        rejection: Option<Rejection>,
    },
    Done,
}

impl<S, ReqB, R> ResponseFuture<S, ReqB, R>
where
    S: Service<Request<ReqB>>,
{
    pub(crate) fn acquiring(
        client: &LockClient,
        names: Vec<String>,
        kind: LockKind,
        service: S,
        request: Request<ReqB>,
        reject: R,
        policy: Arc<Policy>,
    ) -> Self {
        let span = tracing::info_span!(
            "lock",
            keys = ?names,
            waited_ms = tracing::field::Empty,
            tokens = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        let client = client.clone();
        let (wait, lease) = (policy.wait, policy.lease);
        let wanted = names.clone();
        let acquire = Box::pin(async move {
            tokio::time::timeout(wait, client.acquire_all_of_kind(&wanted, lease, kind)).await
        });
        Self {
            grpc: is_grpc(&request),
            state: State::Acquiring {
                acquire,
                service: Some(service),
                request: Some(request),
                started: Instant::now(),
            },
            reject,
            policy,
            names,
            span,
        }
    }

    pub(crate) fn unlocked(future: S::Future, reject: R, policy: Arc<Policy>) -> Self {
        Self {
            state: State::Running {
                future,
                lost: None,
                guards: Vec::new(),
            },
            reject,
            policy,
            names: Vec::new(),
            grpc: false,
            span: tracing::Span::none(),
        }
    }

    pub(crate) fn rejected(rejection: Rejection, reject: R, policy: Arc<Policy>) -> Self {
        Self {
            grpc: rejection.is_grpc(),
            names: Vec::new(),
            state: State::Rejected {
                rejection: Some(rejection),
            },
            reject,
            policy,
            span: tracing::Span::none(),
        }
    }
}

impl<S, ReqB, R, ResB> Future for ResponseFuture<S, ReqB, R>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    R: Reject<ResB>,
{
    type Output = Result<Response<ResB>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let _entered = this.span.enter();
        loop {
            match this.state.as_mut().project() {
                StateProj::Acquiring {
                    acquire,
                    service,
                    request,
                    started,
                } => {
                    let outcome = ready!(acquire.as_mut().poll(cx));
                    let waited = started.elapsed();
                    this.span.record("waited_ms", waited.as_millis() as u64);
                    let request = request.take().expect("polled after taking the request");
                    let mut service = service.take().expect("polled after taking the service");
                    let error = match outcome {
                        Ok(Ok(guards)) => {
                            let next = run_locked(
                                service,
                                request,
                                guards,
                                waited,
                                this.policy.lease_lost,
                                this.span,
                            );
                            this.state.set(next);
                            continue;
                        }
                        Ok(Err(error)) => error,
                        Err(_) => LockError::timeout("the wait bound passed"),
                    };
                    if error.kind() == ErrorKind::RedisUnavailable
                        && this.policy.redis_unavailable == OnRedisUnavailable::FailOpen
                    {
                        this.span.record("outcome", "failed open");
                        tracing::warn!(error = %error, "redis unavailable, running the request unlocked");
                        let future = service.call(request);
                        this.state.set(State::Running {
                            future,
                            lost: None,
                            guards: Vec::new(),
                        });
                        continue;
                    }
                    let rejection = Rejection::from_error(
                        &error,
                        *this.grpc,
                        this.names.clone(),
                        this.policy.retry_after,
                    );
                    this.span
                        .record("outcome", tracing::field::debug(rejection.kind()));
                    this.state.set(State::Rejected {
                        rejection: Some(rejection),
                    });
                }
                StateProj::Running { future, lost, .. } => {
                    if let Some(lost) = lost
                        && let Poll::Ready(reason) = lost.as_mut().poll(cx)
                    {
                        tracing::warn!(?reason, "lease lost while the handler ran; cancelling it");
                        let rejection = Rejection::lease_lost(
                            reason,
                            *this.grpc,
                            this.names.clone(),
                            this.policy.retry_after,
                        );
                        // Drops the handler's future and its guards.
                        this.state.set(State::Rejected {
                            rejection: Some(rejection),
                        });
                        continue;
                    }
                    let output = ready!(future.poll(cx));
                    this.state.set(State::Done);
                    return Poll::Ready(output);
                }
                StateProj::Rejected { rejection } => {
                    let rejection = rejection.take().expect("polled after completion");
                    tracing::info!(kind = ?rejection.kind(), detail = rejection.detail(), "request rejected");
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(this.reject.reject(&rejection)));
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            }
        }
    }
}

/// Hands the request, with its `LockContext`, to the inner service, and keeps the guards.
fn run_locked<S, ReqB>(
    mut service: S,
    mut request: Request<ReqB>,
    guards: Vec<LockGuard>,
    waited: Duration,
    lease_lost: OnLeaseLost,
    span: &tracing::Span,
) -> State<S, ReqB>
where
    S: Service<Request<ReqB>>,
{
    let tokens: Vec<u64> = guards.iter().map(LockGuard::fencing_token).collect();
    span.record("tokens", tracing::field::debug(tokens));
    span.record("outcome", "acquired");
    let context = LockContext::new(&guards, waited);
    let lost = match lease_lost {
        OnLeaseLost::Cancel => {
            let context = context.clone();
            Some(Box::pin(async move { context.lost().await }) as BoxFuture<'static, _>)
        }
        OnLeaseLost::Finish => None,
    };
    request.extensions_mut().insert(context);
    State::Running {
        future: service.call(request),
        lost,
        guards,
    }
}
