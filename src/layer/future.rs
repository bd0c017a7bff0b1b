//! The response future: acquiring → calling (the inner service polled ready, only now that
//! the locks are held) → running the inner future with the guards held → done. The guards
//! are fields, so whatever ends or drops the future releases the locks.
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

use super::answer::answer;
use super::context::LockContext;
use super::held::HeldGuards;
use super::log::LayerLog;
use super::policy::{OnLeaseLost, OnRedisUnavailable, Policy};
use super::reject::{Reject, Rejection, is_grpc};
use crate::client::LockClient;
use crate::error::{ErrorKind, LockError};
use crate::guard::LockGuard;
use crate::keys::display_names;
use crate::lease::LostReason;
use crate::meter::kind_label;

/// The future of [`LockService`](super::LockService).
#[pin_project]
pub struct ResponseFuture<S, ReqB, R>
where
    S: Service<Request<ReqB>>,
{
    #[pin]
    state: State<S, ReqB>,
    reject: R,
    log: Arc<LayerLog>,
    span: tracing::Span,
}

impl<S, ReqB, R> std::fmt::Debug for ResponseFuture<S, ReqB, R>
where
    S: Service<Request<ReqB>>,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

#[pin_project(project = StateProj)]
enum State<S, ReqB>
where
    S: Service<Request<ReqB>>,
{
    Acquiring {
        acquire: BoxFuture<'static, Result<Vec<LockGuard>, LockError>>,
        /// Taken when the locks are acquired (or not). Boxed: the request is large, and
        /// the other states should not carry its room.
        waiting: Option<Box<Waiting<S, ReqB>>>,
    },
    /// The locks are held (or not needed): the inner service is polled ready, then called.
    Calling {
        service: S,
        /// Taken when the service is called. Boxed, as in `Waiting`: the request is large.
        request: Option<Box<Request<ReqB>>>,
        lost: Option<LeaseWatch>,
        guards: HeldGuards,
    },
    Running {
        #[pin]
        future: S::Future,
        /// Cancels the handler when a lease is lost (`OnLeaseLost::Cancel`).
        lost: Option<LeaseWatch>,
        // Held, never read: dropping the state releases the locks (once the handler's
        // guarded writes under way are answered).
        guards: HeldGuards,
    },
    Rejected {
        rejection: Option<Rejection>,
    },
    Done,
}

/// What a request keeps while it waits for its locks.
struct Waiting<S, ReqB> {
    service: S,
    request: Request<ReqB>,
    started: Instant,
    policy: Arc<Policy>,
    /// The lock names asked for, and whether the request is gRPC: what a rejection says.
    names: Vec<String>,
    grpc: bool,
}

/// The lost signals of a running handler's locks, and what its rejection would say.
struct LeaseWatch {
    lost: BoxFuture<'static, LostReason>,
    names: Vec<String>,
    grpc: bool,
    retry_after: Duration,
}

impl<S, ReqB, R> ResponseFuture<S, ReqB, R>
where
    S: Service<Request<ReqB>>,
{
    pub(crate) fn acquiring(
        client: &LockClient,
        names: Vec<String>,
        service: S,
        request: Request<ReqB>,
        reject: R,
        policy: Arc<Policy>,
        log: Arc<LayerLog>,
    ) -> Self {
        let kind = policy.sharing.kind_for(request.method());
        let span = tracing::info_span!(
            "lock",
            keys = %display_names(&names),
            kind = kind_label(kind),
            waited_ms = tracing::field::Empty,
            tokens = tracing::field::Empty,
            handover = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        let client = client.clone();
        let (wait, lease) = (policy.wait, policy.lease);
        let wanted = names.clone();
        let acquire = Box::pin(async move {
            client
                .acquire_all_of_kind_within(&wanted, lease, kind, wait)
                .await
        });
        let waiting = Waiting {
            grpc: is_grpc(&request),
            service,
            request,
            started: Instant::now(),
            policy,
            names,
        };
        Self {
            state: State::Acquiring {
                acquire,
                waiting: Some(Box::new(waiting)),
            },
            reject,
            log,
            span,
        }
    }

    pub(crate) fn unlocked(
        service: S,
        request: Request<ReqB>,
        reject: R,
        log: Arc<LayerLog>,
    ) -> Self {
        Self {
            state: State::Calling {
                service,
                request: Some(Box::new(request)),
                lost: None,
                guards: HeldGuards::default(),
            },
            reject,
            log,
            span: tracing::Span::none(),
        }
    }

    pub(crate) fn rejected(rejection: Rejection, reject: R, log: Arc<LayerLog>) -> Self {
        Self {
            state: State::Rejected {
                rejection: Some(rejection),
            },
            reject,
            log,
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
                StateProj::Acquiring { acquire, waiting } => {
                    let outcome = ready!(acquire.as_mut().poll(cx));
                    let waiting = waiting.take().expect("polled after the locks were taken");
                    let next = waiting.acquired(outcome, this.span, this.log);
                    this.state.set(next);
                }
                StateProj::Calling {
                    service,
                    request,
                    lost,
                    guards,
                } => {
                    if let Some(rejection) = lease_lost(lost, cx) {
                        // Drops the guards.
                        this.state.set(State::Rejected {
                            rejection: Some(rejection),
                        });
                        continue;
                    }
                    if let Err(error) = ready!(service.poll_ready(cx)) {
                        // Drops the guards: the locks are released.
                        this.state.set(State::Done);
                        return Poll::Ready(Err(error));
                    }
                    let request = request.take().expect("called once");
                    let next = State::Running {
                        future: service.call(*request),
                        lost: lost.take(),
                        guards: std::mem::take(guards),
                    };
                    this.state.set(next);
                }
                StateProj::Running { future, lost, .. } => {
                    if let Some(rejection) = lease_lost(lost, cx) {
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
                    this.span.record("outcome", rejection.kind().as_str());
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(answer(&rejection, this.reject, this.log)));
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            }
        }
    }
}

/// The rejection of a handler whose lease was lost, once its lost signal fired.
fn lease_lost(lost: &mut Option<LeaseWatch>, cx: &mut Context<'_>) -> Option<Rejection> {
    let watch = lost.as_mut()?;
    let reason = match watch.lost.as_mut().poll(cx) {
        Poll::Ready(reason) => reason,
        Poll::Pending => return None,
    };
    let names = std::mem::take(&mut watch.names);
    Some(Rejection::lease_lost(
        reason,
        watch.grpc,
        names,
        watch.retry_after,
    ))
}

impl<S, ReqB> Waiting<S, ReqB>
where
    S: Service<Request<ReqB>>,
{
    /// What follows the wait: the handler runs with the locks, or unlocked when Redis is down
    /// and the policy fails open, or the request is rejected.
    fn acquired(
        self,
        outcome: Result<Vec<LockGuard>, LockError>,
        span: &tracing::Span,
        log: &LayerLog,
    ) -> State<S, ReqB> {
        let waited = self.started.elapsed();
        span.record("waited_ms", waited.as_millis() as u64);
        let error = match outcome {
            Ok(guards) => return self.run_locked(guards, waited, span),
            Err(error) => error,
        };
        let Self {
            service,
            request,
            policy,
            names,
            grpc,
            ..
        } = self;
        if error.kind() == ErrorKind::RedisUnavailable
            && policy.redis_unavailable == OnRedisUnavailable::FailOpen
        {
            span.record("outcome", "failed open");
            log.failed_open(&names, &error);
            return State::Calling {
                service,
                request: Some(Box::new(request)),
                lost: None,
                guards: HeldGuards::default(),
            };
        }
        let rejection = Rejection::from_error(&error, grpc, names, policy.retry_after);
        State::Rejected {
            rejection: Some(rejection),
        }
    }

    /// Readies the request, with its `LockContext`, for the inner service, and keeps the
    /// guards.
    fn run_locked(
        self,
        guards: Vec<LockGuard>,
        waited: Duration,
        span: &tracing::Span,
    ) -> State<S, ReqB> {
        let Self {
            service,
            mut request,
            policy,
            names,
            grpc,
            ..
        } = self;
        let tokens: Vec<u64> = guards.iter().map(LockGuard::fencing_token).collect();
        span.record("tokens", tracing::field::debug(tokens));
        // One path per key, as the tokens: `redis`, `local` or `none` (taken as found).
        let handovers: Vec<&str> = guards.iter().map(LockGuard::handover).collect();
        span.record("handover", handovers.join(",").as_str());
        span.record("outcome", "acquired");
        let context = LockContext::new(&guards, waited);
        let guards = HeldGuards::new(guards);
        let context = context.writing_through(guards.writes());
        let lost = match policy.lease_lost {
            OnLeaseLost::Cancel => {
                let context = context.clone();
                Some(LeaseWatch {
                    lost: Box::pin(async move { context.lost().await }),
                    names,
                    grpc,
                    retry_after: policy.retry_after,
                })
            }
            OnLeaseLost::Finish => None,
        };
        request.extensions_mut().insert(context);
        State::Calling {
            service,
            request: Some(Box::new(request)),
            lost,
            guards,
        }
    }
}
