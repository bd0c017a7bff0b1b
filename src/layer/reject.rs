//! The layer's own answers: a typed [`Rejection`], turned into an HTTP or gRPC response by
//! a [`Reject`] hook ([`DefaultRejection`] unless the user brings one).

use std::time::Duration;

use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Request, Response, StatusCode};

use super::body::RejectionBody;
use super::policy::DEFAULT_RETRY_AFTER;
use crate::error::{ErrorKind, LockError};
use crate::keys::display_names;
use crate::lease::LostReason;
use crate::rejection_kind::RejectionKind;

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

    /// What the layer answers when taking the locks `names` fails with `error`, for an HTTP
    /// request with the default `Retry-After`: for a handler that takes locks itself (keys
    /// found where no key extractor looks, such as a body that is not JSON) and answers a
    /// failure as the layer would, keys named: `Rejection::from_lock_error(&err, &names)`
    /// (a response in axum, or `.default_response()`).
    pub fn from_lock_error<N: AsRef<str>>(error: &LockError, names: &[N]) -> Self {
        Self::from_error(error, false, owned(names), DEFAULT_RETRY_AFTER)
    }

    /// What the layer answers when a lease of the locks `names` is lost while the handler
    /// runs (503 with `Retry-After`): for a handler that holds locks itself and stops when
    /// [`any_lost`](crate::any_lost) says one was lost,
    /// `Rejection::from_lost_lease(reason, &names)`.
    pub fn from_lost_lease<N: AsRef<str>>(reason: LostReason, names: &[N]) -> Self {
        Self::lease_lost(reason, false, owned(names), DEFAULT_RETRY_AFTER)
    }

    pub(crate) fn from_error(
        error: &LockError,
        grpc: bool,
        keys: Vec<String>,
        retry_after: Duration,
    ) -> Self {
        let kind = match error.kind() {
            ErrorKind::InvalidName => RejectionKind::InvalidKey,
            ErrorKind::ShutDown => RejectionKind::ShutDown,
            ErrorKind::Timeout => RejectionKind::Timeout,
            ErrorKind::RestartQuarantine => RejectionKind::RestartQuarantine,
            ErrorKind::PermitsMismatch => RejectionKind::PermitsMismatch,
            ErrorKind::InvalidConfig => RejectionKind::Misconfigured,
            _ => RejectionKind::RedisUnavailable,
        };
        // A restart quarantine's end, which Redis told, over the policy's guess.
        let retry_after = error.retry_after().unwrap_or(retry_after);
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

    /// A full explanation, for logs: it may name the Redis failure behind a rejection, which
    /// [`Rejection::message`] keeps from the client.
    pub fn detail(&self) -> &str {
        &self.detail
    }

    /// One sentence for the client, the body of the default answer: what went wrong, with
    /// the keys (each cut to 64 bytes) and, for a bad request, what was wrong with it; never
    /// the Redis failure behind a 503.
    pub fn message(&self) -> String {
        let keys = if self.keys.is_empty() {
            String::new()
        } else {
            format!(" for {}", display_names(&self.keys))
        };
        match self.kind {
            RejectionKind::Timeout => format!("lock wait timed out{keys}; retry later"),
            RejectionKind::RedisUnavailable => {
                format!("lock service unavailable{keys}; retry later")
            }
            RejectionKind::LeaseLost => format!("lock lost while the request ran{keys}; retry"),
            RejectionKind::MissingKey => format!("missing lock key: {}", self.detail),
            RejectionKind::InvalidKey => format!("invalid lock key: {}", self.detail),
            RejectionKind::TooManyKeys => format!("too many lock keys: {}", self.detail),
            RejectionKind::ShutDown => format!("lock service shutting down{keys}; retry later"),
            RejectionKind::RestartQuarantine => format!(
                "lock service recovering from a possible loss of its data (a new or restarted \
                 Redis: its restart quarantine){keys}; retry later"
            ),
            RejectionKind::Misconfigured => format!("lock service misconfigured{keys}"),
            RejectionKind::PermitsMismatch => {
                format!("concurrency limit configured differently across instances{keys}")
            }
            RejectionKind::BodyTooLarge => format!("request body too large: {}", self.detail),
            RejectionKind::BodyUnreadable => "request body could not be read".into(),
            RejectionKind::InvalidIdempotencyKey => {
                format!("invalid idempotency key: {}", self.detail)
            }
            RejectionKind::IdempotencyKeyReused => {
                "idempotency key reused with a different request (method, path or body)".into()
            }
            RejectionKind::IdempotencyInProgress => {
                "a request with this idempotency key is still being processed; retry later".into()
            }
            RejectionKind::ResponseNotStored => "the request with this idempotency key ran, \
                 but its response was too large to store; it will not run again"
                .into(),
            RejectionKind::IdempotencyOutcomeUnknown => "an earlier request with this \
                 idempotency key started and ended without an outcome; it may have taken \
                 effect, so it will not run again"
                .into(),
        }
    }

    /// When a client may try again, for answers that invite a retry.
    pub fn retry_after(&self) -> Option<Duration> {
        match self.kind {
            RejectionKind::Timeout
            | RejectionKind::RedisUnavailable
            | RejectionKind::LeaseLost
            | RejectionKind::ShutDown
            | RejectionKind::RestartQuarantine
            | RejectionKind::IdempotencyInProgress => Some(self.retry_after),
            _ => None,
        }
    }

    /// The HTTP status of the default answer: 503 for what a retry may cure, 400 for bad
    /// keys, 500 for a client configured wrongly for its Redis, for instances that disagree
    /// on a limit and for a response too large to
    /// store and for an idempotent request whose earlier attempt ended without an outcome
    /// (the server's fault, not the client's), 413 for a body over the bound, and as the
    /// idempotency draft asks, 422 for a reused idempotency key and 409 (with `Retry-After`)
    /// while its first request runs.
    pub fn http_status(&self) -> StatusCode {
        match self.kind {
            RejectionKind::PermitsMismatch
            | RejectionKind::ResponseNotStored
            | RejectionKind::IdempotencyOutcomeUnknown
            | RejectionKind::Misconfigured => StatusCode::INTERNAL_SERVER_ERROR,
            RejectionKind::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            RejectionKind::IdempotencyKeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            RejectionKind::IdempotencyInProgress => StatusCode::CONFLICT,
            _ if self.retry_after().is_some() => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::BAD_REQUEST,
        }
    }

    /// The gRPC status code of the default answer: `UNAVAILABLE` (14), `ABORTED` (10) for a
    /// lost lease and for an idempotent request still running, `INVALID_ARGUMENT` (3) for
    /// bad keys and a reused idempotency key, `RESOURCE_EXHAUSTED` (8) for a body over the
    /// bound, `INTERNAL` (13) for a misconfigured client, instances that disagree on a
    /// limit and a response not stored, `UNKNOWN` (2) for an idempotent request whose earlier attempt ended without
    /// an outcome.
    pub fn grpc_code(&self) -> u16 {
        match self.kind {
            RejectionKind::IdempotencyOutcomeUnknown => 2,
            RejectionKind::LeaseLost | RejectionKind::IdempotencyInProgress => 10,
            RejectionKind::PermitsMismatch
            | RejectionKind::ResponseNotStored
            | RejectionKind::Misconfigured => 13,
            RejectionKind::BodyTooLarge => 8,
            _ if self.retry_after().is_some() => 14,
            _ => 3,
        }
    }

    /// The default answer. For HTTP: the status, `Retry-After` where it applies, and
    /// [`Rejection::message`] as a `text/plain; charset=utf-8` body. For gRPC: a
    /// trailers-only response (HTTP 200 with `grpc-status`, and the message as
    /// `grpc-message`) with an empty body.
    pub fn default_response<B: RejectionBody>(&self) -> Response<B> {
        self.response("text/plain; charset=utf-8", || {
            let mut text = self.message();
            text.push('\n');
            text
        })
    }

    /// The answer of [`ProblemJson`]: as [`Rejection::default_response`], but an HTTP body
    /// of `application/problem+json` (RFC 9457): `type` `about:blank`, `title` the status's
    /// reason phrase, `status`, `detail` the [`Rejection::message`], and `kind` its
    /// [`RejectionKind::as_str`].
    pub fn problem_json_response<B: RejectionBody>(&self) -> Response<B> {
        self.response("application/problem+json", || {
            let status = self.http_status();
            format!(
                "{{\"type\":\"about:blank\",\"title\":{},\"status\":{},\"detail\":{},\"kind\":{}}}",
                json_string(status.canonical_reason().unwrap_or_default()),
                status.as_u16(),
                json_string(&self.message()),
                json_string(self.kind.as_str()),
            )
        })
    }

    /// An answer whose HTTP body is `body()` of `content_type`.
    fn response<B: RejectionBody>(
        &self,
        content_type: &'static str,
        body: impl FnOnce() -> String,
    ) -> Response<B> {
        if self.grpc {
            let mut response = Response::new(B::empty());
            let headers = response.headers_mut();
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
            headers.insert("grpc-status", HeaderValue::from(self.grpc_code()));
            if let Ok(message) = HeaderValue::from_str(&grpc_message(&self.message())) {
                headers.insert("grpc-message", message);
            }
            return response;
        }
        let mut response = Response::new(B::from_text(body()));
        *response.status_mut() = self.http_status();
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        if let Some(retry_after) = self.retry_after() {
            let seconds = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
            headers.insert(RETRY_AFTER, HeaderValue::from(seconds.max(1)));
        }
        response
    }
}

/// Builds the responses of the layer's own answers.
///
/// Closures `Fn(&Rejection) -> Response<B>` are hooks too; [`Rejection::default_response`]
/// and [`Rejection::problem_json_response`] are there to fall back on.
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

/// The default answers, with a plain-text body: see [`Rejection::default_response`].
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultRejection;

impl<B: RejectionBody> Reject<B> for DefaultRejection {
    fn reject(&self, rejection: &Rejection) -> Response<B> {
        rejection.default_response()
    }
}

/// The default answers with an `application/problem+json` body (RFC 9457):
/// `.rejection(ProblemJson)`; see [`Rejection::problem_json_response`].
#[derive(Debug, Clone, Copy, Default)]
pub struct ProblemJson;

impl<B: RejectionBody> Reject<B> for ProblemJson {
    fn reject(&self, rejection: &Rejection) -> Response<B> {
        rejection.problem_json_response()
    }
}

pub(crate) fn is_grpc<B>(request: &Request<B>) -> bool {
    request
        .headers()
        .get(CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"application/grpc"))
}

/// `names` as the keys of a rejection.
fn owned<N: AsRef<str>>(names: &[N]) -> Vec<String> {
    names.iter().map(|name| name.as_ref().to_owned()).collect()
}

/// `text` as a JSON string, quotes included.
fn json_string(text: &str) -> String {
    let mut json = String::with_capacity(text.len() + 2);
    json.push('"');
    for c in text.chars() {
        match c {
            '"' => json.push_str("\\\""),
            '\\' => json.push_str("\\\\"),
            '\n' => json.push_str("\\n"),
            c if u32::from(c) < 0x20 => json.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => json.push(c),
        }
    }
    json.push('"');
    json
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
    fn http_answers_carry_status_retry_after_and_a_sentence() {
        let timeout: Response<String> = rejection(RejectionKind::Timeout, false).default_response();
        assert_eq!(timeout.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(timeout.headers()[RETRY_AFTER], "2");
        assert_eq!(timeout.headers()[CONTENT_TYPE], "text/plain; charset=utf-8");
        assert_eq!(
            timeout.body(),
            "lock wait timed out for [acme]; retry later\n"
        );
        let bad: Response<String> = rejection(RejectionKind::InvalidKey, false).default_response();
        assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
        assert!(bad.headers().get(RETRY_AFTER).is_none());
        assert_eq!(bad.body(), "invalid lock key: waited 10% too long ✓\n");
    }

    #[test]
    fn a_503_body_never_names_the_redis_failure_behind_it() {
        let error = LockError::new(ErrorKind::RedisUnavailable, "connect 10.0.0.7:6379 refused");
        let rejection = Rejection::from_lock_error(&error, &["acme"]);
        assert_eq!(rejection.kind(), RejectionKind::RedisUnavailable);
        assert!(rejection.detail().contains("10.0.0.7"));
        let answer: Response<Vec<u8>> = rejection.default_response();
        assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            answer.body(),
            b"lock service unavailable for [acme]; retry later\n"
        );
    }

    #[test]
    fn a_handler_that_takes_locks_itself_names_its_keys_as_the_layer_does() {
        let names = ["accounts:a".to_owned(), "accounts:b".to_owned()];
        let timeout = Rejection::from_lock_error(&LockError::timeout("locks"), &names);
        assert_eq!(timeout.keys(), names);
        let answer: Response<String> = timeout.default_response();
        assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            answer.body(),
            "lock wait timed out for [accounts:a, accounts:b]; retry later\n"
        );
        let lost = Rejection::from_lost_lease(LostReason::Taken, &names);
        assert_eq!(lost.kind(), RejectionKind::LeaseLost);
        let answer: Response<String> = lost.default_response();
        assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(answer.headers()[RETRY_AFTER], "1");
        assert_eq!(
            answer.body(),
            "lock lost while the request ran for [accounts:a, accounts:b]; retry\n"
        );
        assert!(lost.detail().contains("Taken"), "{}", lost.detail());
    }

    #[test]
    fn a_long_key_is_cut_in_the_body() {
        let long = "t".repeat(10_000);
        let rejection = Rejection::new(
            RejectionKind::Timeout,
            false,
            vec![long],
            "",
            Duration::from_secs(1),
        );
        let answer: Response<String> = rejection.default_response();
        assert!(answer.body().len() < 200, "{}", answer.body());
        assert!(
            answer.body().contains("…(+9936 bytes)"),
            "{}",
            answer.body()
        );
    }

    #[test]
    fn problem_json_answers_follow_rfc_9457() {
        let quarantine = Rejection::new(
            RejectionKind::RestartQuarantine,
            false,
            vec!["a\"b\\c".into()],
            "",
            Duration::from_secs(1),
        );
        let answer: Response<String> = quarantine.problem_json_response();
        assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(answer.headers()[CONTENT_TYPE], "application/problem+json");
        assert_eq!(answer.headers()[RETRY_AFTER], "1");
        assert_eq!(
            answer.body(),
            r#"{"type":"about:blank","title":"Service Unavailable","status":503,"detail":"lock service recovering from a possible loss of its data (a new or restarted Redis: its restart quarantine) for [a\"b\\c]; retry later","kind":"restart_quarantine"}"#
        );
        assert_eq!(json_string("tab\there\u{1}"), r#""tab\u0009here\u0001""#);
    }

    #[test]
    fn grpc_answers_are_trailers_only_with_a_status() {
        let lost: Response<String> = rejection(RejectionKind::LeaseLost, true).default_response();
        assert_eq!(lost.status(), StatusCode::OK);
        assert!(lost.body().is_empty());
        assert_eq!(lost.headers()["grpc-status"], "10");
        assert_eq!(
            lost.headers()["grpc-message"],
            "lock lost while the request ran for [acme]; retry"
        );
        let bad: Response<String> = rejection(RejectionKind::InvalidKey, true).default_response();
        assert_eq!(
            bad.headers()["grpc-message"],
            "invalid lock key: waited 10%25 too long %E2%9C%93"
        );
        let down: Response<String> =
            rejection(RejectionKind::RedisUnavailable, true).default_response();
        assert_eq!(down.headers()["grpc-status"], "14");
        let bad: Response<String> = rejection(RejectionKind::TooManyKeys, true).default_response();
        assert_eq!(bad.headers()["grpc-status"], "3");
    }

    #[test]
    fn instances_that_disagree_on_a_limit_get_a_500_that_invites_no_retry() {
        let error = LockError::new(ErrorKind::PermitsMismatch, "held with 3 permits, not 5");
        let mismatch =
            Rejection::from_error(&error, false, vec!["acme".into()], DEFAULT_RETRY_AFTER);
        assert_eq!(mismatch.kind(), RejectionKind::PermitsMismatch);
        assert_eq!(mismatch.kind().as_str(), "permits_mismatch");
        let answer: Response<String> = mismatch.default_response();
        assert_eq!(answer.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(answer.headers().get(RETRY_AFTER).is_none());
        assert_eq!(
            answer.body(),
            "concurrency limit configured differently across instances for [acme]\n"
        );
        let grpc: Response<String> =
            rejection(RejectionKind::PermitsMismatch, true).default_response();
        assert_eq!(grpc.headers()["grpc-status"], "13");
    }

    #[test]
    fn body_and_idempotency_answers_use_the_statuses_the_drafts_name() {
        let answer = |kind| -> Response<String> { rejection(kind, false).default_response() };
        assert_eq!(
            answer(RejectionKind::BodyTooLarge).status(),
            StatusCode::PAYLOAD_TOO_LARGE
        );
        let reused = answer(RejectionKind::IdempotencyKeyReused);
        assert_eq!(reused.status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert!(reused.headers().get(RETRY_AFTER).is_none());
        let running = answer(RejectionKind::IdempotencyInProgress);
        assert_eq!(running.status(), StatusCode::CONFLICT);
        assert_eq!(running.headers()[RETRY_AFTER], "2");
        let not_stored = answer(RejectionKind::ResponseNotStored);
        assert_eq!(not_stored.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(not_stored.headers().get(RETRY_AFTER).is_none());
        assert_eq!(
            answer(RejectionKind::InvalidIdempotencyKey).status(),
            StatusCode::BAD_REQUEST
        );
        let grpc = |kind| -> Response<String> { rejection(kind, true).default_response() };
        assert_eq!(
            grpc(RejectionKind::BodyTooLarge).headers()["grpc-status"],
            "8"
        );
        assert_eq!(
            grpc(RejectionKind::IdempotencyInProgress).headers()["grpc-status"],
            "10"
        );
    }
}
