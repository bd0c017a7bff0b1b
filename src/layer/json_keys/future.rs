//! The body layer's future: reading the body (up to the bound) → calling (the inner service
//! polled ready, only now that the keys are known) → running the inner future → done, or
//! rejected when the body is refused.

use std::error::Error;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use http_body::Body;
use pin_project::pin_project;
use tower::Service;

use super::super::answer::answer;
use super::super::buffer::{BufferedBody, ReadBody, ReadError, request_bytes};
use super::super::log::LayerLog;
use super::super::policy::DEFAULT_RETRY_AFTER;
use super::super::reject::{Reject, Rejection, is_grpc};
use super::find::JsonKeys;
use crate::rejection_kind::RejectionKind;

/// The future of [`JsonKeysService`](super::JsonKeysService).
#[pin_project]
pub struct JsonKeysFuture<S, ReqB, R>
where
    S: Service<Request<ReqB>>,
{
    #[pin]
    state: State<S, ReqB>,
    reject: R,
    log: Arc<LayerLog>,
}

impl<S, ReqB, R> std::fmt::Debug for JsonKeysFuture<S, ReqB, R>
where
    S: Service<Request<ReqB>>,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonKeysFuture").finish_non_exhaustive()
    }
}

#[pin_project(project = StateProj)]
enum State<S, ReqB>
where
    S: Service<Request<ReqB>>,
{
    Reading {
        #[pin]
        body: ReadBody<ReqB>,
        /// Taken when the body is read.
        waiting: Option<Waiting<S>>,
    },
    /// The keys are found: the inner service is polled ready, then called.
    Calling {
        service: S,
        /// Taken when the service is called.
        request: Option<Request<ReqB>>,
    },
    Running {
        #[pin]
        future: S::Future,
    },
    Rejected {
        rejection: Option<Rejection>,
    },
    Done,
}

/// What a request keeps while its body is read.
struct Waiting<S> {
    service: S,
    parts: Parts,
    keys: JsonKeys,
    /// Whether the request is gRPC: what a rejection says.
    grpc: bool,
}

impl<S, ReqB, R> JsonKeysFuture<S, ReqB, R>
where
    S: Service<Request<ReqB>>,
{
    pub(crate) fn reading(
        service: S,
        request: Request<ReqB>,
        keys: JsonKeys,
        reject: R,
        log: Arc<LayerLog>,
    ) -> Self {
        let grpc = is_grpc(&request);
        let (parts, body) = request.into_parts();
        Self {
            state: State::Reading {
                body: ReadBody::new(body, keys.max_body_bytes()),
                waiting: Some(Waiting {
                    service,
                    parts,
                    keys,
                    grpc,
                }),
            },
            reject,
            log,
        }
    }

    pub(crate) fn rejected(rejection: Rejection, reject: R, log: Arc<LayerLog>) -> Self {
        Self {
            state: State::Rejected {
                rejection: Some(rejection),
            },
            reject,
            log,
        }
    }
}

impl<S, ReqB, R, ResB> Future for JsonKeysFuture<S, ReqB, R>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    R: Reject<ResB>,
    ReqB: Body + From<Bytes>,
    ReqB::Error: Into<Box<dyn Error + Send + Sync>>,
{
    type Output = Result<Response<ResB>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Reading { body, waiting } => {
                    let read = ready!(body.poll(cx));
                    let waiting = waiting.take().expect("polled after the body was read");
                    let outcome = request_bytes(read, waiting.keys.max_body_bytes());
                    this.state.set(waiting.read(outcome));
                }
                StateProj::Calling { service, request } => {
                    if let Err(error) = ready!(service.poll_ready(cx)) {
                        this.state.set(State::Done);
                        return Poll::Ready(Err(error));
                    }
                    let request = request.take().expect("called once");
                    let future = service.call(request);
                    this.state.set(State::Running { future });
                }
                StateProj::Running { future } => {
                    let output = ready!(future.poll(cx));
                    this.state.set(State::Done);
                    return Poll::Ready(output);
                }
                StateProj::Rejected { rejection } => {
                    let rejection = rejection.take().expect("polled after completion");
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(answer(&rejection, this.reject, this.log)));
                }
                StateProj::Done => panic!("JsonKeysFuture polled after completion"),
            }
        }
    }
}

impl<S> Waiting<S> {
    /// What follows the read: the request, its body rebuilt from the bytes and the keys in
    /// its extensions, goes on to the inner service; or it is rejected.
    fn read<ReqB>(self, outcome: Result<Bytes, ReadError>) -> State<S, ReqB>
    where
        S: Service<Request<ReqB>>,
        ReqB: From<Bytes>,
    {
        let Self {
            service,
            mut parts,
            keys,
            grpc,
        } = self;
        let refused = |kind, keys, detail| {
            let rejection = Rejection::new(kind, grpc, keys, detail, DEFAULT_RETRY_AFTER);
            State::Rejected {
                rejection: Some(rejection),
            }
        };
        let bytes = match outcome {
            Ok(bytes) => bytes,
            Err(error @ ReadError::TooLarge(_)) => {
                return refused(RejectionKind::BodyTooLarge, Vec::new(), error.to_string());
            }
            Err(error @ ReadError::Failed(_)) => {
                return refused(RejectionKind::BodyUnreadable, Vec::new(), error.to_string());
            }
        };
        match keys.find(&bytes) {
            Ok(found) => {
                keys.store(&mut parts.extensions, found);
                parts.extensions.insert(BufferedBody::new(bytes.clone()));
                State::Calling {
                    service,
                    request: Some(Request::from_parts(parts, ReqB::from(bytes))),
                }
            }
            Err(refusal) => refused(refusal.kind, refusal.keys, refusal.detail),
        }
    }
}
