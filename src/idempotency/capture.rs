//! Reading a body whole, up to a bound: a request to fingerprint it, a response to store it.

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body, Frame};
use http_body_util::BodyExt;

/// A body read as far as the bound let it be.
pub(crate) enum Captured<B> {
    /// Read to its end: its bytes and trailers.
    Whole {
        data: Bytes,
        trailers: Option<HeaderMap>,
    },
    /// Longer than the bound: the frames read so far, and the body to read the rest from.
    Over { read: Vec<Frame<Bytes>>, rest: B },
}

/// Reads `body` to its end unless it holds more than `bound` bytes. A body that says
/// beforehand it is longer (its exact or lowest size) is not read at all.
///
/// # Errors
///
/// The body's own error, while it was read.
pub(crate) async fn capture<B: Body<Data = Bytes> + Unpin>(
    mut body: B,
    bound: usize,
) -> Result<Captured<B>, B::Error> {
    if body.size_hint().lower() > bound as u64 {
        return Ok(Captured::Over {
            read: Vec::new(),
            rest: body,
        });
    }
    let mut read = Vec::new();
    let mut length = 0_usize;
    let mut trailers: Option<HeaderMap> = None;
    while let Some(frame) = body.frame().await {
        let frame = frame?;
        if let Some(data) = frame.data_ref() {
            length += data.len();
        }
        match frame.into_trailers() {
            Ok(more) => trailers.get_or_insert_with(HeaderMap::new).extend(more),
            Err(frame) => read.push(frame),
        }
        if length > bound {
            if let Some(trailers) = trailers {
                read.push(Frame::trailers(trailers));
            }
            return Ok(Captured::Over { read, rest: body });
        }
    }
    let mut data = BytesMut::with_capacity(length);
    for frame in read {
        if let Ok(chunk) = frame.into_data() {
            data.extend_from_slice(&chunk);
        }
    }
    Ok(Captured::Whole {
        data: data.freeze(),
        trailers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;
    use http_body_util::Full;

    fn captured(body: &'static [u8], bound: usize) -> Captured<Full<Bytes>> {
        capture(Full::new(Bytes::from_static(body)), bound)
            .now_or_never()
            .expect("a full body is ready")
            .expect("no error")
    }

    #[test]
    fn a_body_within_the_bound_is_read_whole_and_a_longer_one_is_not() {
        assert!(matches!(
            captured(b"four", 4),
            Captured::Whole { data, trailers: None } if data == "four"
        ));
        assert!(matches!(
            captured(b"five!", 4),
            Captured::Over { read, .. } if read.is_empty()
        ));
    }
}
