//! The layer's own answers: a typed [`Rejection`], turned into an HTTP or gRPC response by
//! a [`Reject`] hook ([`DefaultRejection`] unless the user brings one).

use std::time::Duration;

use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Request, Response, StatusCode};

use crate::error::LockError;
use crate::guard::LostReason;

/// Why the layer answered a request itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RejectionKind {
    /// The locks were not acquired within the wait bound.
    Timeout,
    /// Redis could not be reached (or failed) while taking the locks.
    RedisUnavailable,
    /// The lease was lost while the handler ran, and the handler was cancelled.
    LeaseLost,
    /// The request named no key and the policy rejects such requests.
    MissingKey,
    /// A key was unusable: not text, empty, longer than the limit, or sent twice.
    InvalidKey,
    /// The request named more keys than the layer allows.
    TooManyKeys,
    /// The lock client was shut down.
    ShutDown,
}

/// A request the layer answered itself, with what a response needs to say.
#[derive(Debug)]
pub struct Rejection {
    kind: RejectionKind,
    grpc: bool,
    keys: Vec<String>,
    detail: String,
    retry_after: Duration,
}

impl Rejection {
    pub(crate) fn new(
        kind: RejectionKind,
        grpc: bool,
        keys: Vec<String>,
        detail: impl Into<String>,
        retry_after: Duration,
    ) -> Self {
        Self {
            kind,
            grpc,
            keys,
            detail: detail.into(),
            retry_after,
        }
    }

    pub(crate) fn from_error(
        error: &LockError,
        grpc: bool,
        keys: Vec<String>,
        retry_after: Duration,
    ) -> Self {
        use crate::error::ErrorKind;
        let kind = match error.kind() {
            ErrorKind::InvalidName => RejectionKind::InvalidKey,
            ErrorKind::ShutDown => RejectionKind::ShutDown,
            ErrorKind::Timeout => RejectionKind::Timeout,
            _ => RejectionKind::RedisUnavailable,
        };
        Self::new(kind, grpc, keys, error.to_string(), retry_after)
    }

    pub(crate) fn lease_lost(
        reason: LostReason,
        grpc: bool,
        keys: Vec<String>,
        retry_after: Duration,
    ) -> Self {
        let detail = format!("the lock lease was lost ({reason:?}) while the handler ran");
        Self::new(RejectionKind::LeaseLost, grpc, keys, detail, retry_after)
    }

    /// Why.
    pub fn kind(&self) -> RejectionKind {
        self.kind
    }

    /// Whether the request was gRPC (`content-type: application/grpc…`).
    pub fn is_grpc(&self) -> bool {
        self.grpc
    }

    /// The lock names the request asked for (with the layer's prefix).
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// A human-readable explanation, for logs.
    pub fn detail(&self) -> &str {
        &self.detail
    }

    /// When a client may try again, for answers that invite a retry.
    pub fn retry_after(&self) -> Option<Duration> {
        match self.kind {
            RejectionKind::Timeout
            | RejectionKind::RedisUnavailable
            | RejectionKind::LeaseLost
            | RejectionKind::ShutDown => Some(self.retry_after),
            _ => None,
        }
    }

    /// The HTTP status of the default answer: 503 for what a retry may cure, 400 for bad keys.
    pub fn http_status(&self) -> StatusCode {
        match self.retry_after() {
            Some(_) => StatusCode::SERVICE_UNAVAILABLE,
            None => StatusCode::BAD_REQUEST,
        }
    }

    /// The gRPC status code of the default answer: `UNAVAILABLE` (14), `ABORTED` (10) for a
    /// lost lease, `INVALID_ARGUMENT` (3) for bad keys.
    pub fn grpc_code(&self) -> u16 {
        match self.kind {
            RejectionKind::LeaseLost => 10,
            _ if self.retry_after().is_some() => 14,
            _ => 3,
        }
    }

    /// The default answer: for HTTP the status with `Retry-After` where it applies, for gRPC
    /// a trailers-only response (HTTP 200 with `grpc-status` and `grpc-message`). The body
    /// is empty.
    pub fn default_response<B: Default>(&self) -> Response<B> {
        let mut response = Response::new(B::default());
        if !self.grpc {
            *response.status_mut() = self.http_status();
        }
        let headers = response.headers_mut();
        if self.grpc {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
            headers.insert("grpc-status", HeaderValue::from(self.grpc_code()));
            if let Ok(message) = HeaderValue::from_str(&grpc_message(&self.detail)) {
                headers.insert("grpc-message", message);
            }
        } else if let Some(retry_after) = self.retry_after() {
            let seconds = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
            headers.insert(RETRY_AFTER, HeaderValue::from(seconds.max(1)));
        }
        response
    }
}

/// Builds the responses of the layer's own answers.
///
/// Closures `Fn(&Rejection) -> Response<B>` are hooks too; [`Rejection::default_response`]
/// is there to fall back on.
pub trait Reject<B>: Clone + Send + Sync + 'static {
    /// The response for `rejection`.
    fn reject(&self, rejection: &Rejection) -> Response<B>;
}

impl<B, F> Reject<B> for F
where
    F: Fn(&Rejection) -> Response<B> + Clone + Send + Sync + 'static,
{
    fn reject(&self, rejection: &Rejection) -> Response<B> {
        self(rejection)
    }
}

/// The default answers: see [`Rejection::default_response`].
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultRejection;

impl<B: Default> Reject<B> for DefaultRejection {
    fn reject(&self, rejection: &Rejection) -> Response<B> {
        rejection.default_response()
    }
}

pub(crate) fn is_grpc<B>(request: &Request<B>) -> bool {
    request
        .headers()
        .get(CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"application/grpc"))
}

/// Percent-encodes a `grpc-message` as the gRPC spec asks.
fn grpc_message(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if (0x20..0x7f).contains(&byte) && byte != b'%' {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejection(kind: RejectionKind, grpc: bool) -> Rejection {
        Rejection::new(
            kind,
            grpc,
            vec!["acme".into()],
            "waited 10% too long ✓",
            Duration::from_millis(1500),
        )
    }

    #[test]
    fn grpc_requests_are_told_apart_by_content_type() {
        let grpc = Request::builder()
            .header(CONTENT_TYPE, "application/grpc+proto")
            .body(())
            .unwrap();
        assert!(is_grpc(&grpc));
        assert!(!is_grpc(&Request::new(())));
    }

    #[test]
    fn http_answers_carry_status_and_retry_after() {
        let timeout: Response<()> = rejection(RejectionKind::Timeout, false).default_response();
        assert_eq!(timeout.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(timeout.headers()[RETRY_AFTER], "2");
        let bad: Response<()> = rejection(RejectionKind::InvalidKey, false).default_response();
        assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
        assert!(bad.headers().get(RETRY_AFTER).is_none());
    }

    #[test]
    fn grpc_answers_are_trailers_only_with_a_status() {
        let lost: Response<()> = rejection(RejectionKind::LeaseLost, true).default_response();
        assert_eq!(lost.status(), StatusCode::OK);
        assert_eq!(lost.headers()["grpc-status"], "10");
        assert_eq!(
            lost.headers()["grpc-message"],
            "waited 10%25 too long %E2%9C%93"
        );
        let down: Response<()> =
            rejection(RejectionKind::RedisUnavailable, true).default_response();
        assert_eq!(down.headers()["grpc-status"], "14");
        let bad: Response<()> = rejection(RejectionKind::TooManyKeys, true).default_response();
        assert_eq!(bad.headers()["grpc-status"], "3");
    }
}
