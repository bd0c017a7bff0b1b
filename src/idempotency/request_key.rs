//! The idempotency key of a request: the header's one value, as the draft writes it (a
//! structured-field string, `"…"`) or bare, as payment APIs take it.

use http::{HeaderMap, HeaderName};

/// Longest key taken: 255 bytes, the bound payment APIs document (a UUID is 36).
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;

/// What the request says about its key.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum RequestKey {
    /// No header.
    Missing,
    /// A usable key.
    Found(String),
    /// A header that is not a key, and why.
    Malformed(String),
}

/// The key `header` carries in `headers`.
pub(crate) fn request_key(headers: &HeaderMap, header: &HeaderName) -> RequestKey {
    let mut values = headers.get_all(header).iter();
    let Some(value) = values.next() else {
        return RequestKey::Missing;
    };
    if values.next().is_some() {
        return RequestKey::Malformed(format!("the {header} header is sent more than once"));
    }
    let bytes = value.as_bytes();
    let key = match bytes {
        [b'"', inner @ .., b'"'] => inner,
        _ => bytes,
    };
    if key.is_empty() {
        return RequestKey::Malformed(format!("the {header} header is empty"));
    }
    if key.len() > MAX_IDEMPOTENCY_KEY_LEN {
        return RequestKey::Malformed(format!(
            "the {header} header is {} bytes, over the limit of {MAX_IDEMPOTENCY_KEY_LEN}",
            key.len()
        ));
    }
    if !key
        .iter()
        .all(|byte| byte.is_ascii_graphic() && *byte != b'"')
    {
        return RequestKey::Malformed(format!(
            "the {header} header holds a byte that is not visible ASCII"
        ));
    }
    RequestKey::Found(String::from_utf8_lossy(key).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_of(values: &[&[u8]]) -> RequestKey {
        let header = HeaderName::from_static("idempotency-key");
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(&header, http::HeaderValue::from_bytes(value).unwrap());
        }
        request_key(&headers, &header)
    }

    #[test]
    fn a_key_is_taken_bare_or_quoted_and_refused_when_malformed() {
        assert_eq!(key_of(&[]), RequestKey::Missing);
        let found = RequestKey::Found("8e03978e-40d5".into());
        assert_eq!(key_of(&[b"8e03978e-40d5"]), found);
        assert_eq!(key_of(&[b"\"8e03978e-40d5\""]), found);
        for bad in [
            &[b"a".as_slice(), b"b"][..],
            &[b""],
            &[b"\"\""],
            &[b"two words"],
            &[b"caf\xe9"],
            &[&[b'k'; 256]],
        ] {
            assert!(
                matches!(key_of(bad), RequestKey::Malformed(_)),
                "{bad:?} was taken"
            );
        }
        assert!(matches!(key_of(&[&[b'k'; 255]]), RequestKey::Found(_)));
    }
}
