//! The bodies an idempotent request and its response are rebuilt in: once read whole (to
//! fingerprint a request, to store a response), a body is handed on as the bytes it held;
//! a response read only in part (longer than the store's bound) is handed on as what was
//! read followed by the rest.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use http_body_util::combinators::{BoxBody, UnsyncBoxBody};
use pin_project::pin_project;

/// A body type the idempotency layer can rebuild: from bytes it read whole (and the
/// trailers, which carry a gRPC response's status), and from the frames it read of a body
/// followed by the rest of it. Implemented for axum's body (feature `axum`), tonic 0.14's
/// (feature `tonic`), and http-body-util's `BoxBody` and `UnsyncBoxBody` (tonic 0.12, 0.13).
#[diagnostic::on_unimplemented(
    message = "the idempotency layer cannot rebuild a `{Self}` body",
    note = "enable the `axum` or `tonic` feature of tower-redis-lock for their bodies, or \
            implement `ReplayableBody` for yours"
)]
pub trait ReplayableBody: Body<Data = Bytes> + Sized + Send + 'static {
    /// A body of `data`, then `trailers`.
    fn replay(data: Bytes, trailers: Option<HeaderMap>) -> Self;

    /// The frames read already, then what is left of `rest`.
    fn resume(read: Vec<Frame<Bytes>>, rest: Self) -> Self;
}

#[cfg(feature = "axum")]
impl ReplayableBody for axum::body::Body {
    fn replay(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        Self::new(Replayed::new(data, trailers))
    }

    fn resume(read: Vec<Frame<Bytes>>, rest: Self) -> Self {
        Self::new(Resumed::new(read, rest))
    }
}

#[cfg(feature = "tonic")]
impl ReplayableBody for tonic::body::Body {
    fn replay(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        Self::new(Replayed::new(data, trailers))
    }

    fn resume(read: Vec<Frame<Bytes>>, rest: Self) -> Self {
        Self::new(Resumed::new(read, rest))
    }
}

impl<E: Send + 'static> ReplayableBody for UnsyncBoxBody<Bytes, E> {
    fn replay(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        Replayed::new(data, trailers)
            .map_err(|never: Infallible| match never {})
            .boxed_unsync()
    }

    fn resume(read: Vec<Frame<Bytes>>, rest: Self) -> Self {
        Resumed::new(read, rest).boxed_unsync()
    }
}

impl<E: Send + 'static> ReplayableBody for BoxBody<Bytes, E> {
    fn replay(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        Replayed::new(data, trailers)
            .map_err(|never: Infallible| match never {})
            .boxed()
    }

    fn resume(read: Vec<Frame<Bytes>>, rest: Self) -> Self {
        Resumed::new(read, rest).boxed()
    }
}

/// Bytes known whole, then trailers.
#[derive(Debug)]
struct Replayed {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl Replayed {
    fn new(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        Self {
            data: Some(data).filter(|data| !data.is_empty()),
            trailers,
        }
    }
}

impl Body for Replayed {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        let frame = match this.data.take() {
            Some(data) => Some(Frame::data(data)),
            None => this.trailers.take().map(Frame::trailers),
        };
        Poll::Ready(frame.map(Ok))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |data| data.len() as u64))
    }
}

/// Frames read already, then the body they were read from.
#[pin_project]
#[derive(Debug)]
struct Resumed<B> {
    read: VecDeque<Frame<Bytes>>,
    #[pin]
    rest: B,
}

impl<B> Resumed<B> {
    fn new(read: Vec<Frame<Bytes>>, rest: B) -> Self {
        Self {
            read: read.into(),
            rest,
        }
    }
}

impl<B: Body<Data = Bytes>> Body for Resumed<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        match this.read.pop_front() {
            Some(frame) => Poll::Ready(Some(Ok(frame))),
            None => this.rest.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.read.is_empty() && self.rest.is_end_stream()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{Full, StreamBody};

    type Boxed = UnsyncBoxBody<Bytes, Infallible>;

    #[tokio::test]
    async fn a_replayed_body_gives_its_bytes_then_its_trailers() {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        let body = Boxed::replay(Bytes::from_static(b"hello"), Some(trailers.clone()));
        let collected = body.collect().await.unwrap();
        assert_eq!(collected.trailers(), Some(&trailers));
        assert_eq!(collected.to_bytes(), "hello");
    }

    #[tokio::test]
    async fn a_resumed_body_gives_what_was_read_then_the_rest() {
        let frames = [b"a".as_slice(), b"bc", b"def"]
            .map(|part| Ok::<_, Infallible>(Frame::data(Bytes::from_static(part))));
        let mut body = StreamBody::new(futures_util::stream::iter(frames)).boxed_unsync();
        let first = body.frame().await.unwrap().unwrap();
        let resumed = Boxed::resume(vec![first], body);
        assert_eq!(resumed.collect().await.unwrap().to_bytes(), "abcdef");
        let whole = Boxed::resume(
            Vec::new(),
            Full::new(Bytes::from_static(b"x")).boxed_unsync(),
        );
        assert_eq!(whole.collect().await.unwrap().to_bytes(), "x");
    }
}
