//! `LockService`: extracts the keys and starts the response future.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::Service;

use super::extract::KeyExtractor;
use super::future::ResponseFuture;
use super::log::LayerLog;
use super::policy::{OnMissingKey, Policy};
use super::reject::{Reject, Rejection, RejectionKind, is_grpc};
use crate::client::LockClient;

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

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        // Call the service that was polled ready, and keep a fresh clone for the next call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
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
                    ResponseFuture::unlocked(
                        inner.call(request),
                        self.reject.clone(),
                        self.log.clone(),
                    )
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
