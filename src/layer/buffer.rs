//! Reading a request body into memory up to a bound, for the layers that look inside it
//! (keys in a JSON body): the length a request declares is checked before a byte is read,
//! the bytes as they arrive, and the body handed on is rebuilt from the same bytes, which
//! stay in the request's extensions ([`BufferedBody`]) for later layers and the handler.

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{BufMut, Bytes, BytesMut};
use http::Request;
use http::header::CONTENT_LENGTH;
use http_body::Body;
use http_body_util::LengthLimitError;
use pin_project::pin_project;

/// Default bound on a body a layer reads into memory: 64 KiB, far above a transfer or an
/// order and far below what would hurt a server holding a few thousand of them at once.
pub const DEFAULT_MAX_BODY: usize = 64 * 1024;

/// The body of a request, as a layer of this crate read it into memory, in the request's
/// extensions: later layers and the handler (`Extension<BufferedBody>` in axum) find the
/// bytes here. The request's body holds the same bytes (shared, not copied), so a handler
/// may as well read its body as usual.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferedBody(Bytes);

impl BufferedBody {
    pub(crate) fn new(bytes: Bytes) -> Self {
        Self(bytes)
    }

    /// The body's bytes.
    pub fn bytes(&self) -> &Bytes {
        &self.0
    }
}

/// Why a body was not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReadError {
    /// Longer than the bound: of this layer (`Some`) or of a layer outside it that cut the
    /// body short (`None`, tower-http's `RequestBodyLimit` say).
    TooLarge(Option<usize>),
    /// The body failed (the client went away, say), with what it said.
    Failed(String),
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooLarge(Some(limit)) => write!(f, "over the limit of {limit} bytes"),
            Self::TooLarge(None) => f.write_str("over the limit of a layer in front"),
            Self::Failed(error) => write!(f, "the body could not be read ({error})"),
        }
    }
}

/// The length `request` announces when it is over `limit`: its `Content-Length`, or the
/// least its body says it holds. Such a request is refused before a byte of it is read.
pub(crate) fn declared_over<B: Body>(request: &Request<B>, limit: usize) -> Option<u64> {
    let limit = u64::try_from(limit).unwrap_or(u64::MAX);
    let header = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u64>().ok());
    let declared = header.unwrap_or(0).max(request.body().size_hint().lower());
    (declared > limit).then_some(declared)
}

/// Reads a body to its end, failing as soon as it holds more than `limit` bytes (the bytes
/// past it are never buffered). Trailers are dropped: the body handed on has none.
#[pin_project]
#[derive(Debug)]
pub(crate) struct ReadBody<B> {
    #[pin]
    body: B,
    bytes: BytesMut,
    limit: usize,
}

impl<B> ReadBody<B> {
    pub(crate) fn new(body: B, limit: usize) -> Self {
        Self {
            body,
            bytes: BytesMut::new(),
            limit,
        }
    }
}

impl<B> Future for ReadBody<B>
where
    B: Body,
    B::Error: Into<Box<dyn Error + Send + Sync>>,
{
    type Output = Result<Bytes, ReadError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let Some(frame) = ready!(this.body.as_mut().poll_frame(cx)) else {
                return Poll::Ready(Ok(std::mem::take(this.bytes).freeze()));
            };
            let frame = match frame {
                Ok(frame) => frame,
                Err(error) => return Poll::Ready(Err(read_error(error.into()))),
            };
            let Ok(data) = frame.into_data() else {
                continue; // trailers
            };
            let len = bytes::Buf::remaining(&data);
            if this.bytes.len().saturating_add(len) > *this.limit {
                return Poll::Ready(Err(ReadError::TooLarge(Some(*this.limit))));
            }
            this.bytes.put(data);
        }
    }
}

/// A body's failure: a length limit of a layer in front (its error anywhere in the chain,
/// as axum wraps the errors of the bodies it boxes) is a body too large, not a failure.
fn read_error(error: Box<dyn Error + Send + Sync>) -> ReadError {
    let mut cause: Option<&(dyn Error + 'static)> = Some(error.as_ref());
    while let Some(current) = cause {
        if current.is::<LengthLimitError>() {
            return ReadError::TooLarge(None);
        }
        cause = current.source();
    }
    ReadError::Failed(error.to_string())
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use futures_util::FutureExt;
    use futures_util::stream;
    use http_body::Frame;
    use http_body_util::{BodyExt, Full, Limited, StreamBody};

    use super::*;

    fn chunks(
        parts: &[&'static str],
    ) -> StreamBody<impl futures_util::Stream<Item = Result<Frame<Bytes>, Infallible>>> {
        let frames: Vec<_> = parts
            .iter()
            .map(|part| Ok(Frame::data(Bytes::from_static(part.as_bytes()))))
            .collect();
        StreamBody::new(stream::iter(frames))
    }

    fn read<B>(body: B, limit: usize) -> Result<Bytes, ReadError>
    where
        B: Body,
        B::Error: Into<Box<dyn Error + Send + Sync>>,
    {
        ReadBody::new(body, limit)
            .now_or_never()
            .expect("a body in memory is ready")
    }

    #[test]
    fn a_body_is_read_up_to_its_limit_and_not_a_byte_past_it() {
        assert_eq!(read(chunks(&["ab", "cd"]), 4), Ok(Bytes::from("abcd")));
        assert_eq!(
            read(chunks(&["ab", "cde"]), 4),
            Err(ReadError::TooLarge(Some(4)))
        );
        assert_eq!(read(chunks(&[]), 0), Ok(Bytes::new()));
    }

    #[test]
    fn a_limit_of_a_layer_in_front_is_a_body_too_large() {
        let cut = Limited::new(chunks(&["abc", "def"]), 4);
        assert_eq!(read(cut, 100), Err(ReadError::TooLarge(None)));
        // Behind a box, as axum keeps bodies.
        let boxed = Limited::new(chunks(&["abc", "def"]), 4).boxed_unsync();
        assert_eq!(read(boxed, 100), Err(ReadError::TooLarge(None)));
    }

    #[test]
    fn the_declared_length_is_checked_before_reading() {
        let declared = |length: &str, body: Full<Bytes>| {
            let request = Request::builder()
                .header(CONTENT_LENGTH, length)
                .body(body)
                .unwrap();
            declared_over(&request, 10)
        };
        assert_eq!(declared("11", Full::default()), Some(11));
        assert_eq!(declared("10", Full::default()), None);
        assert_eq!(declared("junk", Full::default()), None);
        // The body's own size counts when the header says less (or nothing).
        assert_eq!(declared("0", Full::new(Bytes::from(vec![0; 12]))), Some(12));
    }
}
