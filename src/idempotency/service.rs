//! `IdempotencyService`: reads the key and the scope, then runs the request's flow.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::Service;

use super::flow::{Flow, answer_now, run_unguarded};
use super::future::ResponseFuture;
use super::record::IdempotencyRecords;
use super::replay_body::ReplayableBody;
use super::request_key::{RequestKey, request_key};
use super::settings::Settings;
use crate::layer::answer::answer;
use crate::layer::log::LayerLog;
use crate::layer::reject::is_grpc;
use crate::layer::{KeyExtractor, OnMissingKey, Reject, Rejection, RejectionKind};
use crate::meter::{self, IdempotentOutcome};

/// The service [`IdempotencyLayer`](super::IdempotencyLayer) wraps around an inner service.
#[derive(Debug, Clone)]
pub struct IdempotencyService<S, E, R> {
    inner: S,
    records: IdempotencyRecords,
    scope: E,
    reject: R,
    settings: Arc<Settings>,
    log: Arc<LayerLog>,
}

impl<S, E, R> IdempotencyService<S, E, R> {
    pub(crate) fn new(
        inner: S,
        records: IdempotencyRecords,
        scope: E,
        reject: R,
        settings: Arc<Settings>,
        log: Arc<LayerLog>,
    ) -> Self {
        Self {
            inner,
            records,
            scope,
            reject,
            settings,
            log,
        }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, E, R, ReqB, ResB> Service<Request<ReqB>> for IdempotencyService<S, E, R>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send + 'static,
    E: KeyExtractor<ReqB>,
    R: Reject<ResB>,
    ReqB: ReplayableBody,
    ReqB::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    ResB: ReplayableBody + Unpin,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = ResponseFuture<Response<ResB>, S::Error>;

    /// Always ready: each request's flow polls its own clone of the inner service ready when
    /// it runs the request, so duplicates waiting for the first hold none of its capacity.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        let inner = self.inner.clone();
        let settings = &self.settings;
        let grpc = is_grpc(&request);
        let reject = |kind, detail: String| {
            meter::idempotent(IdempotentOutcome::Rejected);
            let rejection = Rejection::new(kind, grpc, Vec::new(), detail, settings.retry_after);
            answer_now(answer(&rejection, &self.reject, &self.log))
        };
        let scope = match self.scope.extract(&request) {
            Ok(scope) => scope,
            Err(invalid) => {
                let detail = format!("invalid idempotency scope: {invalid}");
                return reject(RejectionKind::InvalidIdempotencyKey, detail);
            }
        };
        let key = match request_key(request.headers(), &settings.header) {
            RequestKey::Found(key) if !scope.is_empty() => key,
            RequestKey::Malformed(why) => return reject(RejectionKind::InvalidIdempotencyKey, why),
            RequestKey::Found(_) | RequestKey::Missing => match settings.missing_key {
                OnMissingKey::Reject => {
                    let detail = format!("the request has no {} header", settings.header);
                    return reject(RejectionKind::InvalidIdempotencyKey, detail);
                }
                OnMissingKey::PassThrough => {
                    meter::idempotent(IdempotentOutcome::NoKey);
                    return ResponseFuture::new(run_unguarded(inner, request));
                }
            },
        };
        let flow = Flow {
            records: self.records.clone(),
            scope: scope.as_slice().to_vec(),
            key,
            reject: self.reject.clone(),
            settings: settings.clone(),
            log: self.log.clone(),
            grpc,
        };
        ResponseFuture::detached(flow.run(inner, request))
    }
}
