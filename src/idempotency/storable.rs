//! Which answers are kept for a key's retries, as [`StoredAnswers`] says.

use http::{HeaderMap, StatusCode};

use super::settings::StoredAnswers;

/// The gRPC statuses a retry may cure: `UNKNOWN`, `DEADLINE_EXCEEDED`, `RESOURCE_EXHAUSTED`,
/// `ABORTED`, `INTERNAL`, `UNAVAILABLE`, `DATA_LOSS`.
const RETRYABLE_GRPC: [&[u8]; 7] = [b"2", b"4", b"8", b"10", b"13", b"14", b"15"];

/// Whether a response is kept for its duplicates. Never a server error (5xx, or a gRPC status
/// a retry may cure) nor 429: each says the request did not do its work, and a retry should
/// run it, not be told the failure for a day. Every other answer, 4xx included, is kept under
/// [`StoredAnswers::AllButServerErrors`]; only successes (2xx, gRPC `OK` or no status) under
/// [`StoredAnswers::SuccessOnly`].
pub(crate) fn storable(
    status: StatusCode,
    headers: &HeaderMap,
    trailers: Option<&HeaderMap>,
    answers: StoredAnswers,
) -> bool {
    let grpc_status = trailers
        .and_then(|trailers| trailers.get("grpc-status"))
        .or_else(|| headers.get("grpc-status"))
        .map(|code| code.as_bytes());
    match answers {
        StoredAnswers::AllButServerErrors => {
            !status.is_server_error()
                && status != StatusCode::TOO_MANY_REQUESTS
                && grpc_status.is_none_or(|code| !RETRYABLE_GRPC.contains(&code))
        }
        StoredAnswers::SuccessOnly => {
            status.is_success() && grpc_status.is_none_or(|code| code == b"0")
        }
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    #[test]
    fn server_errors_and_throttling_are_not_kept_and_other_answers_are() {
        let all = StoredAnswers::AllButServerErrors;
        let none = HeaderMap::new();
        assert!(storable(StatusCode::CREATED, &none, None, all));
        assert!(storable(StatusCode::UNPROCESSABLE_ENTITY, &none, None, all));
        assert!(!storable(StatusCode::SERVICE_UNAVAILABLE, &none, None, all));
        assert!(!storable(StatusCode::TOO_MANY_REQUESTS, &none, None, all));
        let mut grpc = HeaderMap::new();
        grpc.insert("grpc-status", HeaderValue::from_static("14"));
        assert!(!storable(StatusCode::OK, &none, Some(&grpc), all));
        assert!(!storable(StatusCode::OK, &grpc, None, all));
        grpc.insert("grpc-status", HeaderValue::from_static("5"));
        assert!(storable(StatusCode::OK, &none, Some(&grpc), all));
    }

    #[test]
    fn only_successes_are_kept_when_asked() {
        let success = StoredAnswers::SuccessOnly;
        let none = HeaderMap::new();
        assert!(storable(StatusCode::CREATED, &none, None, success));
        assert!(!storable(StatusCode::BAD_REQUEST, &none, None, success));
        assert!(!storable(
            StatusCode::UNPROCESSABLE_ENTITY,
            &none,
            None,
            success
        ));
        assert!(!storable(
            StatusCode::SERVICE_UNAVAILABLE,
            &none,
            None,
            success
        ));
        let mut grpc = HeaderMap::new();
        grpc.insert("grpc-status", HeaderValue::from_static("0"));
        assert!(storable(StatusCode::OK, &none, Some(&grpc), success));
        grpc.insert("grpc-status", HeaderValue::from_static("5"));
        assert!(!storable(StatusCode::OK, &none, Some(&grpc), success));
    }
}
