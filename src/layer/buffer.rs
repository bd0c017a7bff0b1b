//! Reading a body into memory up to a bound, for the layers that look inside it (keys in a
//! JSON body, an idempotent request's fingerprint, an idempotent response to store): the
//! length a request declares is checked before a byte is read, the bytes as they arrive, and
//! the request body handed on is rebuilt from the same bytes, which stay in the request's
//! extensions ([`BufferedBody`]) for later layers and the handler.

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::header::CONTENT_LENGTH;
use http::{HeaderMap, Request};
use http_body::{Body, Frame};
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

/// Reads a body to its end unless it holds more than `bound` bytes, frame by frame: the one
/// reader of the crate, for requests (keys in a JSON body, an idempotent request's
/// fingerprint) and for responses (an idempotent response to store). A body that says
/// beforehand it is longer (its exact or lowest size) is not read at all; a longer one is
/// read no further than the frame that passes the bound.
#[pin_project]
#[derive(Debug)]
pub(crate) struct ReadBody<B> {
    #[pin]
    body: B,
    read: Vec<Frame<Bytes>>,
    length: usize,
    bound: usize,
    started: bool,
}

/// How far a [`ReadBody`] got. Past the bound, `Rest` is what the reader keeps of the body:
/// nothing for [`ReadBody`] itself ([`ReadBody::into_parts`] takes it out), the frames read
/// and the rest of the body for [`capture`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Reading<Rest = ()> {
    /// To the body's end: its bytes and trailers.
    Whole {
        data: Bytes,
        trailers: Option<HeaderMap>,
    },
    /// Past the bound.
    Over(Rest),
}

/// A body [`capture`] read: whole, or past the bound with the frames read and the body to
/// read the rest from.
pub(crate) type Captured<B> = Reading<(Vec<Frame<Bytes>>, B)>;

impl<B> ReadBody<B> {
    pub(crate) fn new(body: B, bound: usize) -> Self {
        Self {
            body,
            read: Vec::new(),
            length: 0,
            bound,
            started: false,
        }
    }

    /// After [`Reading::Over`]: the frames read, and the body to read the rest from.
    pub(crate) fn into_parts(self) -> (Vec<Frame<Bytes>>, B) {
        (self.read, self.body)
    }
}

impl<B: Body> Future for ReadBody<B> {
    type Output = Result<Reading, B::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let bound = u64::try_from(*this.bound).unwrap_or(u64::MAX);
        if !std::mem::replace(this.started, true) && this.body.size_hint().lower() > bound {
            return Poll::Ready(Ok(Reading::Over(())));
        }
        loop {
            let Some(frame) = ready!(this.body.as_mut().poll_frame(cx)) else {
                let read = std::mem::take(this.read);
                return Poll::Ready(Ok(whole(read, *this.length)));
            };
            let frame = frame?.map_data(|mut data| data.copy_to_bytes(data.remaining()));
            if let Some(data) = frame.data_ref() {
                *this.length = this.length.saturating_add(data.len());
            }
            this.read.push(frame);
            if *this.length > *this.bound {
                return Poll::Ready(Ok(Reading::Over(())));
            }
        }
    }
}

/// A body read to its end: its data in one piece (the one chunk as it came, when there was
/// one) and its trailers.
fn whole(read: Vec<Frame<Bytes>>, length: usize) -> Reading {
    let mut chunks = Vec::with_capacity(read.len());
    let mut trailers: Option<HeaderMap> = None;
    for frame in read {
        match frame.into_data() {
            Ok(chunk) => chunks.push(chunk),
            Err(frame) => {
                if let Ok(more) = frame.into_trailers() {
                    trailers.get_or_insert_with(HeaderMap::new).extend(more);
                }
            }
        }
    }
    let data = if chunks.len() == 1 {
        chunks.pop().unwrap_or_default()
    } else {
        let mut data = BytesMut::with_capacity(length);
        for chunk in chunks {
            data.put(chunk);
        }
        data.freeze()
    };
    Reading::Whole { data, trailers }
}

/// Reads `body` with [`ReadBody`], keeping the rest of one over the bound (an idempotent
/// response too long to store still goes to its client whole).
///
/// # Errors
///
/// The body's own error, while it was read.
pub(crate) async fn capture<B: Body + Unpin>(
    body: B,
    bound: usize,
) -> Result<Captured<B>, B::Error> {
    let mut reader = ReadBody::new(body, bound);
    Ok(match (&mut reader).await? {
        Reading::Whole { data, trailers } => Reading::Whole { data, trailers },
        Reading::Over(()) => Reading::Over(reader.into_parts()),
    })
}

/// A request body as the layers that look inside it take it: its bytes when it was read
/// whole within `bound` (trailers dropped: the body handed on has none), else why not.
pub(crate) fn request_bytes<E>(read: Result<Reading, E>, bound: usize) -> Result<Bytes, ReadError>
where
    E: Into<Box<dyn Error + Send + Sync>>,
{
    match read {
        Ok(Reading::Whole { data, .. }) => Ok(data),
        Ok(Reading::Over(())) => Err(ReadError::TooLarge(Some(bound))),
        Err(error) => Err(read_error(error.into())),
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
        let read = ReadBody::new(body, limit)
            .now_or_never()
            .expect("a body in memory is ready");
        request_bytes(read, limit)
    }

    #[test]
    fn a_body_over_the_bound_keeps_what_was_read_and_the_rest_to_read() {
        let mut reader = ReadBody::new(chunks(&["ab", "cde", "f"]), 4);
        let reading = (&mut reader).now_or_never().expect("ready").unwrap();
        assert_eq!(reading, Reading::Over(()));
        let (read, rest) = reader.into_parts();
        let read: Vec<Bytes> = read
            .into_iter()
            .filter_map(|f| f.into_data().ok())
            .collect();
        assert_eq!(read, ["ab", "cde"], "read up to the frame past the bound");
        let rest = rest.collect().now_or_never().expect("ready").unwrap();
        assert_eq!(rest.to_bytes(), "f");

        // A body that says it is longer is not read at all.
        let mut long = ReadBody::new(Full::new(Bytes::from_static(b"five!")), 4);
        assert_eq!(
            (&mut long).now_or_never().unwrap().unwrap(),
            Reading::Over(())
        );
        assert!(long.into_parts().0.is_empty());

        // Trailers come with the data of a body read whole.
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        let frames = vec![
            Ok::<_, Infallible>(Frame::data(Bytes::from_static(b"ok"))),
            Ok(Frame::trailers(trailers.clone())),
        ];
        let body = StreamBody::new(stream::iter(frames));
        let reading = ReadBody::new(body, 4).now_or_never().unwrap().unwrap();
        assert_eq!(
            reading,
            Reading::Whole {
                data: Bytes::from_static(b"ok"),
                trailers: Some(trailers)
            }
        );
    }

    #[test]
    fn a_body_is_read_up_to_its_limit_and_refused_past_it() {
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
