//! `JsonKeysService`: refuses a body declared over the bound, and starts the future that
//! reads the rest.

use std::error::Error;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower::Service;

use super::super::buffer::declared_over;
use super::super::log::LayerLog;
use super::super::policy::DEFAULT_RETRY_AFTER;
use super::super::reject::{Reject, Rejection, is_grpc};
use super::find::JsonKeys;
use super::future::JsonKeysFuture;
use crate::rejection_kind::RejectionKind;

/// The service [`JsonKeysLayer`](super::JsonKeysLayer) wraps around an inner service.
///
/// The request body type must convert from `Bytes` (axum's `Body`, http-body-util's
/// `Full<Bytes>`): the body handed on is rebuilt from the bytes read, so the inner service
/// keeps its body type. Every axum router and `axum::serve` hand their services axum's
/// `Body`; below hyper's own `Incoming` body, map it into one of those first.
#[derive(Debug, Clone)]
pub struct JsonKeysService<S, R> {
    inner: S,
    keys: JsonKeys,
    reject: R,
    log: Arc<LayerLog>,
}

impl<S, R> JsonKeysService<S, R> {
    pub(crate) fn new(inner: S, keys: JsonKeys, reject: R, log: Arc<LayerLog>) -> Self {
        Self {
            inner,
            keys,
            reject,
            log,
        }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, R, ReqB, ResB> Service<Request<ReqB>> for JsonKeysService<S, R>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    R: Reject<ResB>,
    ReqB: Body + From<Bytes>,
    ReqB::Error: Into<Box<dyn Error + Send + Sync>>,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = JsonKeysFuture<S, ReqB, R>;

    /// Always ready: each request's future polls its own clone of the inner service ready
    /// once the body is read, so a slow upload holds none of the inner service's capacity
    /// (and none of a lock: the lock layer inside has not run yet).
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        // A clone of its own for each request, polled ready by the request's future.
        let inner = self.inner.clone();
        let limit = self.keys.max_body_bytes();
        if let Some(declared) = declared_over(&request, limit) {
            let detail = format!("{declared} bytes, over the limit of {limit}");
            let rejection = Rejection::new(
                RejectionKind::BodyTooLarge,
                is_grpc(&request),
                Vec::new(),
                detail,
                DEFAULT_RETRY_AFTER,
            );
            return JsonKeysFuture::rejected(rejection, self.reject.clone(), self.log.clone());
        }
        JsonKeysFuture::reading(
            inner,
            request,
            self.keys.clone(),
            self.reject.clone(),
            self.log.clone(),
        )
    }
}
