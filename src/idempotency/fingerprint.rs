//! What makes two requests with one idempotency key the same request: the method, the path
//! with its query, and the body (its bytes, or its JSON parsed), hashed (SHA-256) so the
//! store keeps 64 characters a request.

use std::borrow::Cow;

use http::request::Parts;
use ring::digest::{SHA256, digest};

use super::settings::BodyComparison;

/// The fingerprint of a request: lower-case hex SHA-256 of its method, path and query, and
/// body (as `comparison` reads it), each ended by a byte no method or path holds, so no two
/// requests run together.
pub(crate) fn fingerprint(parts: &Parts, body: &[u8], comparison: BodyComparison) -> String {
    let body = compared(body, comparison);
    let target = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path(), |target| target.as_str());
    let mut input = Vec::with_capacity(parts.method.as_str().len() + target.len() + body.len() + 2);
    input.extend_from_slice(parts.method.as_str().as_bytes());
    input.push(b'\n');
    input.extend_from_slice(target.as_bytes());
    input.push(b'\n');
    input.extend_from_slice(&body);
    digest(&SHA256, &input)
        .as_ref()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// The body as it is compared: its bytes, or its JSON written again without spacing and
/// with every object's members sorted, when it parses.
fn compared(body: &[u8], comparison: BodyComparison) -> Cow<'_, [u8]> {
    match comparison {
        BodyComparison::Bytes => Cow::Borrowed(body),
        #[cfg(feature = "json")]
        BodyComparison::Json => match serde_json::from_slice::<serde_json::Value>(body) {
            Ok(parsed) => match serde_json::to_vec(&sorted(parsed)) {
                Ok(written) => Cow::Owned(written),
                Err(_) => Cow::Borrowed(body),
            },
            Err(_) => Cow::Borrowed(body),
        },
    }
}

/// `value` with every object's members in the order of their names, whether serde_json keeps
/// maps sorted or, with its `preserve_order` feature that another crate may turn on, in the
/// order they came.
#[cfg(feature = "json")]
fn sorted(value: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Object(members) => {
            let mut members: Vec<_> = members.into_iter().collect();
            members.sort_by(|(a, _), (b, _)| a.cmp(b));
            Value::Object(
                members
                    .into_iter()
                    .map(|(name, value)| (name, sorted(value)))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
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
        fingerprint(&parts, body, BodyComparison::Bytes)
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

    #[cfg(feature = "json")]
    #[test]
    fn parsed_json_is_the_same_request_whatever_its_spacing_and_member_order() {
        let (parts, ()) = Request::post("/pay").body(()).unwrap().into_parts();
        let json = |body: &[u8]| fingerprint(&parts, body, BodyComparison::Json);
        let first = json(br#"{"amount":1200,"card":{"cvc":"1","number":"4"}}"#);
        assert_eq!(
            first,
            json(b"{ \"card\": {\"number\":\"4\",\"cvc\":\"1\"},\n \"amount\": 1200 }")
        );
        assert_ne!(
            first,
            json(br#"{"amount":1201,"card":{"cvc":"1","number":"4"}}"#)
        );
        // Not JSON: byte for byte, as without parsing.
        assert_eq!(
            json(b"a b"),
            fingerprint(&parts, b"a b", BodyComparison::Bytes)
        );
        assert_ne!(json(b"a b"), json(b"a  b"));
    }
}
