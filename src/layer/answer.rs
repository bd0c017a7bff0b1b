//! The one way a layer answers a request itself: the rejection is counted in
//! `redis_lock_layer_rejections_total` by its kind, logged (one line per kind and second, see
//! [`LayerLog`]), and turned into a response by the layer's [`Reject`] hook. The lock layer,
//! the JSON-keys layer and the idempotency layer all answer through it, so every kind counted
//! at 0 when a client starts is one a layer can count.

use http::Response;

use super::log::LayerLog;
use super::reject::{Reject, Rejection};
use crate::meter;

/// The response to `rejection`, counted and logged.
pub(crate) fn answer<B>(
    rejection: &Rejection,
    reject: &impl Reject<B>,
    log: &LayerLog,
) -> Response<B> {
    meter::layer_rejection(rejection.kind());
    log.rejected(rejection);
    reject.reject(rejection)
}
