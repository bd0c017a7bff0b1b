//! The response bodies the layer's own answers can be written in.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::combinators::{BoxBody, UnsyncBoxBody};
use http_body_util::{BodyExt, Empty, Full};

/// A response body the layer's answers can be written in: empty for gRPC, a short text for
/// HTTP. Implemented for `String`, `Vec<u8>`, `Bytes`, http-body-util's `Full<Bytes>`,
/// `BoxBody<Bytes, E>` and `UnsyncBoxBody<Bytes, E>` (the body type of tonic 0.12 and 0.13),
/// axum's body (feature `axum`) and tonic 0.14's (feature `tonic`); and for `()` and
/// `Empty<Bytes>`, which hold no text. For another body type, implement it, or give the
/// layer a hook of your own ([`LockLayer::rejection`](super::LockLayer::rejection)).
#[diagnostic::on_unimplemented(
    message = "the layer cannot write its answers in a `{Self}` body",
    note = "enable the `axum` or `tonic` feature of tower-redis-lock for their bodies, implement \
            `RejectionBody` for yours, or answer rejections yourself with `LockLayer::rejection`"
)]
pub trait RejectionBody: Sized {
    /// An empty body.
    fn empty() -> Self;

    /// A body holding `text`.
    fn from_text(text: String) -> Self;
}

/// A body that holds nothing: the text is left out.
impl RejectionBody for () {
    fn empty() -> Self {}

    fn from_text(_text: String) -> Self {}
}

/// A body that holds nothing: the text is left out.
impl RejectionBody for Empty<Bytes> {
    fn empty() -> Self {
        Self::new()
    }

    fn from_text(_text: String) -> Self {
        Self::new()
    }
}

impl RejectionBody for String {
    fn empty() -> Self {
        Self::new()
    }

    fn from_text(text: String) -> Self {
        text
    }
}

impl RejectionBody for Vec<u8> {
    fn empty() -> Self {
        Self::new()
    }

    fn from_text(text: String) -> Self {
        text.into_bytes()
    }
}

impl RejectionBody for Bytes {
    fn empty() -> Self {
        Self::new()
    }

    fn from_text(text: String) -> Self {
        text.into()
    }
}

impl RejectionBody for Full<Bytes> {
    fn empty() -> Self {
        Self::default()
    }

    fn from_text(text: String) -> Self {
        Self::new(text.into())
    }
}

impl<E: 'static> RejectionBody for UnsyncBoxBody<Bytes, E> {
    fn empty() -> Self {
        Self::default()
    }

    fn from_text(text: String) -> Self {
        Full::<Bytes>::from_text(text)
            .map_err(|never: Infallible| match never {})
            .boxed_unsync()
    }
}

impl<E: 'static> RejectionBody for BoxBody<Bytes, E> {
    fn empty() -> Self {
        Self::default()
    }

    fn from_text(text: String) -> Self {
        Full::<Bytes>::from_text(text)
            .map_err(|never: Infallible| match never {})
            .boxed()
    }
}

#[cfg(feature = "tonic")]
impl RejectionBody for tonic::body::Body {
    fn empty() -> Self {
        Self::empty()
    }

    fn from_text(text: String) -> Self {
        Self::new(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_body_type_holds_the_text() {
        macro_rules! text {
            ($body:expr) => {
                futures_util::FutureExt::now_or_never($body.collect())
                    .expect("a full body is ready")
                    .expect("no error")
                    .to_bytes()
            };
        }
        assert_eq!(text!(Full::<Bytes>::from_text("hi".into())), "hi");
        assert_eq!(
            text!(UnsyncBoxBody::<Bytes, Infallible>::from_text("hi".into())),
            "hi"
        );
        assert_eq!(
            text!(BoxBody::<Bytes, Infallible>::from_text("hi".into())),
            "hi"
        );
        assert_eq!(text!(UnsyncBoxBody::<Bytes, Infallible>::empty()), "");
        assert_eq!(Bytes::from_text("hi".into()), "hi");
    }
}
