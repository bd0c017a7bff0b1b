//! axum integration (feature `axum`): a key extractor that reads the route parameters axum
//! matched, `LockContext` as an extractor, and the layer's answers as axum responses.

use std::convert::Infallible;

use ::axum::body::Body;
use ::axum::extract::{FromRequestParts, OptionalFromRequestParts, RawPathParams};
use ::axum::response::{IntoResponse, Response};
use futures_util::FutureExt;
use http::request::Parts;
use http::{Request, StatusCode};

use super::body::RejectionBody;
use super::context::LockContext;
use super::extract::{InvalidKey, KeyExtractor, Keys};
use super::reject::Rejection;

/// The route parameter `name` as axum's router matched it: with
/// `.route("/tenants/{tenant}/invoices", …)`, `PathParamKey::new("tenant")` takes `acme` from
/// `/tenants/acme/invoices`, and under `nest("/api", …)` from `/api/tenants/acme/invoices`,
/// since the router, not a template of the layer's, decides. Percent-decoded as axum decodes
/// it; a parameter that does not decode to UTF-8 is an invalid key.
///
/// The layer must run inside the router, after its match: `Router::layer` or
/// `Router::route_layer`. Wrapped around the whole router, it sees no parameters and the
/// request has no key.
#[derive(Debug, Clone)]
pub struct PathParamKey {
    name: String,
}

impl PathParamKey {
    /// The route parameter called `name` (as written in the route, without braces).
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
        }
    }
}

impl<B> KeyExtractor<B> for PathParamKey {
    fn extract(&self, request: &Request<B>) -> Result<Keys, InvalidKey> {
        // axum keeps the parameters in a private extension that only its extractors read,
        // and they read request parts: a copy of the extensions is enough.
        let (mut parts, ()) = Request::new(()).into_parts();
        parts.extensions = request.extensions().clone();
        let params = RawPathParams::from_request_parts(&mut parts, &())
            .now_or_never()
            .expect("reading the route parameters never waits");
        match params {
            Ok(params) => Ok(params
                .iter()
                .find(|(name, _)| *name == self.name)
                .map(|(_, value)| value.to_owned())
                .into()),
            Err(rejection) if rejection.status() == StatusCode::BAD_REQUEST => {
                Err(InvalidKey::new(format!(
                    "a path parameter does not decode to UTF-8 ({rejection})"
                )))
            }
            // Not inside a router: no parameters.
            Err(_) => Ok(Keys::none()),
        }
    }
}

/// The answer of a handler that asks for a `LockContext` the request does not have.
#[derive(Debug, Clone, Copy)]
pub struct MissingLockContext;

impl IntoResponse for MissingLockContext {
    fn into_response(self) -> Response {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "the request holds no lock: its route is not behind a LockLayer, its extractor \
             found no key, or Redis was unreachable and the layer failed open; take \
             Option<LockContext> where that may happen\n",
        )
            .into_response()
    }
}

/// `LockContext` as a handler argument: answers 500 ([`MissingLockContext`]) when the request
/// runs without the layer's locks; take `Option<LockContext>` where that may happen (a
/// keyless request passed through, or `OnRedisUnavailable::FailOpen`).
impl<S: Send + Sync> FromRequestParts<S> for LockContext {
    type Rejection = MissingLockContext;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<LockContext>()
            .cloned()
            .ok_or(MissingLockContext)
    }
}

/// `Option<LockContext>` as a handler argument: `None` when the request runs without the
/// layer's locks.
impl<S: Send + Sync> OptionalFromRequestParts<S> for LockContext {
    type Rejection = Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        _state: &S,
    ) -> Result<Option<Self>, Self::Rejection> {
        Ok(parts.extensions.get::<LockContext>().cloned())
    }
}

impl RejectionBody for Body {
    fn empty() -> Self {
        Self::empty()
    }

    fn from_text(text: String) -> Self {
        text.into()
    }
}

/// [`Rejection::default_response`], so a handler that takes locks itself may return
/// `Result<_, Rejection>`.
impl IntoResponse for Rejection {
    fn into_response(self) -> Response {
        self.default_response()
    }
}
