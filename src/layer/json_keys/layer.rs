//! `JsonKeysLayer`: the body layer of a [`JsonKeys`], with the hook of its own answers.

use std::sync::Arc;

use tower::Layer;

use super::super::log::LayerLog;
use super::super::reject::DefaultRejection;
use super::find::JsonKeys;
use super::service::JsonKeysService;

/// Reads each request's body up to the bound of its [`JsonKeys`], finds the keys in it, and
/// hands the request on with its body intact, the keys (for the `LockLayer` inside it) and
/// the bytes ([`BufferedBody`](super::super::BufferedBody)) in its extensions:
/// `keys.layer()`.
///
/// Its own answers: 413 for a body over the bound ([`RejectionKind::BodyTooLarge`], gRPC
/// `RESOURCE_EXHAUSTED`), 400 for a body without its keys ([`RejectionKind::MissingKey`])
/// or with unusable ones, not JSON, or that could not be read
/// ([`RejectionKind::InvalidKey`]), gRPC `INVALID_ARGUMENT`; in the body the lock layer's
/// answers have ([`JsonKeysLayer::rejection`] to build them yourself), logged as the lock
/// layer logs its own.
///
/// [`RejectionKind::BodyTooLarge`]: super::super::RejectionKind::BodyTooLarge
/// [`RejectionKind::MissingKey`]: super::super::RejectionKind::MissingKey
/// [`RejectionKind::InvalidKey`]: super::super::RejectionKind::InvalidKey
#[derive(Debug, Clone)]
#[must_use]
pub struct JsonKeysLayer<R = DefaultRejection> {
    keys: JsonKeys,
    reject: R,
    /// Shared by every service this layer makes (and by its clones).
    log: Arc<LayerLog>,
}

impl JsonKeys {
    /// The body layer that finds these keys; it must run before (outside) the `LockLayer`
    /// given this `JsonKeys` (or a clone). With axum, add it after:
    /// `.layer(LockLayer::new(locks, keys.clone())).layer(keys.layer())`; with
    /// `ServiceBuilder`, before: `.layer(keys.layer()).layer(LockLayer::new(locks, keys))`.
    pub fn layer(&self) -> JsonKeysLayer {
        JsonKeysLayer {
            keys: self.clone(),
            reject: DefaultRejection,
            log: Arc::default(),
        }
    }
}

impl<R> JsonKeysLayer<R> {
    /// Builds the layer's own answers (body too large, keys missing or invalid) with
    /// `reject`, as [`LockLayer::rejection`](super::super::LockLayer::rejection) does: for
    /// example [`ProblemJson`](super::super::ProblemJson), or a closure
    /// `|rejection: &Rejection| -> Response<B>`.
    pub fn rejection<R2>(self, reject: R2) -> JsonKeysLayer<R2> {
        JsonKeysLayer {
            keys: self.keys,
            reject,
            log: self.log,
        }
    }
}

impl<S, R: Clone> Layer<S> for JsonKeysLayer<R> {
    type Service = JsonKeysService<S, R>;

    fn layer(&self, inner: S) -> Self::Service {
        JsonKeysService::new(
            inner,
            self.keys.clone(),
            self.reject.clone(),
            self.log.clone(),
        )
    }
}
