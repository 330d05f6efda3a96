//! Reading a request body whole.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use http_body::Body;
use pin_project_lite::pin_project;

pin_project! {
    /// A body read to its end, as one `Bytes`: a body of one data frame (hyper's for a small
    /// request, a `Full`) is that frame as it is, with no copy and no list of frames; the
    /// frames of a longer body are joined. Trailers are dropped.
    pub(super) struct Gather<B> {
        #[pin]
        body: B,
        first: Option<Bytes>,
        joined: Option<BytesMut>,
    }
}

impl<B> Gather<B> {
    /// Reads `body`.
    pub(super) fn new(body: B) -> Self {
        Gather {
            body,
            first: None,
            joined: None,
        }
    }
}

impl<B: Body<Data = Bytes>> Future for Gather<B> {
    type Output = Result<Bytes, B::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let Some(frame) = ready!(this.body.as_mut().poll_frame(cx)) else {
                let whole = match (this.joined.take(), this.first.take()) {
                    (Some(joined), _) => joined.freeze(),
                    (None, first) => first.unwrap_or_default(),
                };
                return Poll::Ready(Ok(whole));
            };
            let Ok(data) = frame?.into_data() else {
                continue;
            };
            if data.is_empty() {
                continue;
            }
            if let Some(joined) = this.joined.as_mut() {
                joined.extend_from_slice(&data);
            } else if let Some(first) = this.first.take() {
                let mut joined = BytesMut::with_capacity(first.len() + data.len());
                joined.extend_from_slice(&first);
                joined.extend_from_slice(&data);
                *this.joined = Some(joined);
            } else {
                *this.first = Some(data);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full, StreamBody};

    type Frames = StreamBody<
        futures::stream::Iter<
            std::vec::IntoIter<Result<http_body::Frame<Bytes>, std::convert::Infallible>>,
        >,
    >;

    fn frames(chunks: &[&str]) -> Frames {
        let frames: Vec<_> = chunks
            .iter()
            .map(|c| Ok(http_body::Frame::data(Bytes::copy_from_slice(c.as_bytes()))))
            .collect();
        StreamBody::new(futures::stream::iter(frames))
    }

    #[tokio::test]
    async fn one_frame_is_kept_as_it_is_and_more_are_joined() {
        let one = Bytes::from_static(b"{\"id\":1}");
        let got = Gather::new(Full::new(one.clone())).await.unwrap();
        assert_eq!(got, one);
        assert_eq!(got.as_ptr(), one.as_ptr(), "the frame itself, not a copy");
        let got = Gather::new(frames(&["{\"id\"", "", ":1", "}"]))
            .await
            .unwrap();
        assert_eq!(got, one);
        assert!(Gather::new(frames(&[])).await.unwrap().is_empty());
        // The same bytes as http-body-util's collect, whatever the split.
        let text = "{\"id\":1}";
        for at in 0..=text.len() {
            let (a, b) = text.split_at(at);
            let reference = frames(&[a, b]).collect().await.unwrap().to_bytes();
            assert_eq!(Gather::new(frames(&[a, b])).await.unwrap(), reference);
        }
    }
}
