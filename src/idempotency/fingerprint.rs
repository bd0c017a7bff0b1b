//! What makes two requests with one idempotency key the same request: the method, the path
//! with its query, and the body, hashed (SHA-256) so the store keeps 64 characters a request.

use http::request::Parts;
use ring::digest::{SHA256, digest};

/// The fingerprint of a request: lower-case hex SHA-256 of its method, path and query, and
/// body, each ended by a byte no method or path holds, so no two requests run together.
pub(crate) fn fingerprint(parts: &Parts, body: &[u8]) -> String {
    let target = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path(), |target| target.as_str());
    let mut input = Vec::with_capacity(parts.method.as_str().len() + target.len() + body.len() + 2);
    input.extend_from_slice(parts.method.as_str().as_bytes());
    input.push(b'\n');
    input.extend_from_slice(target.as_bytes());
    input.push(b'\n');
    input.extend_from_slice(body);
    digest(&SHA256, &input)
        .as_ref()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    fn of(method: &str, uri: &str, body: &[u8]) -> String {
        let (parts, ()) = Request::builder()
            .method(method)
            .uri(uri)
            .body(())
            .unwrap()
            .into_parts();
        fingerprint(&parts, body)
    }

    #[test]
    fn the_method_the_path_the_query_and_the_body_each_count() {
        let first = of("POST", "/orders?x=1", b"{}");
        assert_eq!(first.len(), 64);
        assert_eq!(first, of("POST", "/orders?x=1", b"{}"));
        assert_ne!(first, of("PUT", "/orders?x=1", b"{}"));
        assert_ne!(first, of("POST", "/orders?x=2", b"{}"));
        assert_ne!(first, of("POST", "/orders?x=1", b"{ }"));
        // The separators keep the parts apart.
        assert_ne!(of("POST", "/a", b"b"), of("POST", "/ab", b""));
        // SHA-256 of "GET\n/\n", as `sha256sum` gives it.
        assert_eq!(
            of("GET", "/", b""),
            "139fb16fdd19069e75f6f3dd0e619a89fb157dab65e8722c66e6b3fd43f7900c"
        );
    }
}
