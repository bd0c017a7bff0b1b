//! `LockService`: extracts the keys and starts the response future.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::Service;

use super::extract::KeyExtractor;
use super::future::ResponseFuture;
use super::log::LayerLog;
use super::policy::{OnMissingKey, Policy};
use super::reject::{Reject, Rejection, is_grpc};
use crate::client::LockClient;
use crate::rejection_kind::RejectionKind;

/// The service [`LockLayer`](super::LockLayer) wraps around an inner service.
#[derive(Debug, Clone)]
pub struct LockService<S, K, R> {
    inner: S,
    client: LockClient,
    extractor: K,
    reject: R,
    policy: Arc<Policy>,
    log: Arc<LayerLog>,
}

impl<S, K, R> LockService<S, K, R> {
    pub(crate) fn new(
        inner: S,
        client: LockClient,
        extractor: K,
        reject: R,
        policy: Arc<Policy>,
        log: Arc<LayerLog>,
    ) -> Self {
        Self {
            inner,
            client,
            extractor,
            reject,
            policy,
            log,
        }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, K, R, ReqB, ResB> Service<Request<ReqB>> for LockService<S, K, R>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send,
    K: KeyExtractor<ReqB>,
    R: Reject<ResB>,
    ReqB: Send + 'static,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqB, R>;

    /// Always ready: the inner service is reserved (polled ready) by each request's future
    /// only once its locks are held, so requests waiting for a busy key never hold capacity
    /// of the inner service (a concurrency limit under the layer) that others could use.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        // A clone of its own for each request, polled ready by the request's future.
        let inner = self.inner.clone();
        let policy = &self.policy;
        let reject = |kind, keys, detail: String| {
            let grpc = is_grpc(&request);
            let rejection = Rejection::new(kind, grpc, keys, detail, policy.retry_after);
            ResponseFuture::rejected(rejection, self.reject.clone(), self.log.clone())
        };
        let keys = match self.extractor.extract(&request) {
            Ok(keys) => keys,
            Err(invalid) => {
                return reject(RejectionKind::InvalidKey, Vec::new(), invalid.to_string());
            }
        };
        if keys.is_empty() {
            return match policy.missing_key {
                OnMissingKey::PassThrough => {
                    if !policy.missing_key_chosen {
                        self.log.keyless(&request);
                    }
                    ResponseFuture::unlocked(inner, request, self.reject.clone(), self.log.clone())
                }
                OnMissingKey::Reject => reject(
                    RejectionKind::MissingKey,
                    Vec::new(),
                    "the request names no lock key".into(),
                ),
            };
        }
        // Checked before the prefix is added: with a prefix, an empty key would otherwise
        // lock the bare prefix, a name no request meant.
        if keys.as_slice().iter().any(String::is_empty) {
            return reject(
                RejectionKind::InvalidKey,
                Vec::new(),
                "a lock key is empty".into(),
            );
        }
        let names: Vec<String> = keys
            .into_vec()
            .into_iter()
            .map(|key| format!("{}{key}", policy.key_prefix))
            .collect();
        if names.len() > policy.max_keys {
            let detail = format!(
                "{} keys, over the limit of {}",
                names.len(),
                policy.max_keys
            );
            return reject(RejectionKind::TooManyKeys, names, detail);
        }
        ResponseFuture::acquiring(
            &self.client,
            names,
            inner,
            request,
            self.reject.clone(),
            policy.clone(),
            self.log.clone(),
        )
    }
}
