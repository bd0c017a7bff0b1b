//! The response future of [`IdempotencyService`](super::IdempotencyService).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::future::BoxFuture;

/// The future of [`IdempotencyService`](super::IdempotencyService): a boxed async flow,
/// since a first request awaits five steps in turn (read the store, take the lock, read it
/// again, run the request, store its response) and reads best top to bottom.
pub struct ResponseFuture<T, E> {
    flow: BoxFuture<'static, Result<T, E>>,
}

impl<T, E> ResponseFuture<T, E> {
    pub(crate) fn new(flow: impl Future<Output = Result<T, E>> + Send + 'static) -> Self {
        Self {
            flow: Box::pin(flow),
        }
    }
}

impl<T, E> Future for ResponseFuture<T, E> {
    type Output = Result<T, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.flow.as_mut().poll(cx)
    }
}

impl<T, E> fmt::Debug for ResponseFuture<T, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
