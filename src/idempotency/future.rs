//! The response future of [`IdempotencyService`](super::IdempotencyService).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::future::BoxFuture;
use tracing::Instrument;

/// The future of [`IdempotencyService`](super::IdempotencyService): a boxed async flow,
/// since a first request awaits six steps in turn (read the store, take the lock, read it
/// again, mark the key started, run the request, store its response) and reads best top to
/// bottom. A request with a key runs its flow in a task of its own, which this future
/// awaits: dropping this future (the client went away) leaves the flow to finish.
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

impl<T: Send + 'static, E: Send + 'static> ResponseFuture<T, E> {
    /// The future of a flow that runs to its end in a task of its own, whatever happens to
    /// this future: a client that goes away (hyper and tonic drop the response future) must
    /// not cancel a handler after its effect and before its outcome is stored. A panic in
    /// the flow is raised again here.
    pub(crate) fn detached(flow: impl Future<Output = Result<T, E>> + Send + 'static) -> Self {
        let task = tokio::spawn(flow.in_current_span());
        Self::new(async move {
            match task.await {
                Ok(answer) => answer,
                Err(failed) if failed.is_panic() => std::panic::resume_unwind(failed.into_panic()),
                Err(_) => {
                    panic!("an idempotent request's task was cancelled: the runtime shut down")
                }
            }
        })
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
