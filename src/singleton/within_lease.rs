//! A leader's task, polled only while its lease lasts: past the lease's end as this process
//! reckons it, the task is never polled again, even by a process that was paused past it and
//! has not yet heard from its watchdog.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project::pin_project;
use tokio::time::Instant;

use crate::guard::LeaseEnd;

/// How a leader's task stopped being polled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TaskOutcome {
    /// The task returned.
    Finished,
    /// The lease ran out (or was about to) before the task returned; it was not polled again.
    LeaseRanOut,
}

/// Polls `task` only while the lease has not run out, and never after it once it has: the
/// check comes before every poll, so the answer stays the same however often it is polled.
#[pin_project]
pub(crate) struct WithinLease<F> {
    #[pin]
    task: F,
    lease_end: LeaseEnd,
    outcome: Option<TaskOutcome>,
}

impl<F> WithinLease<F> {
    pub(crate) fn new(task: F, lease_end: LeaseEnd) -> Self {
        Self {
            task,
            lease_end,
            outcome: None,
        }
    }
}

impl<F: Future<Output = ()>> Future for WithinLease<F> {
    type Output = TaskOutcome;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<TaskOutcome> {
        let this = self.project();
        if let Some(outcome) = *this.outcome {
            return Poll::Ready(outcome);
        }
        if Instant::now() >= this.lease_end.at() {
            *this.outcome = Some(TaskOutcome::LeaseRanOut);
            return Poll::Ready(TaskOutcome::LeaseRanOut);
        }
        let polled = this.task.poll(cx);
        if polled.is_ready() {
            *this.outcome = Some(TaskOutcome::Finished);
            return Poll::Ready(TaskOutcome::Finished);
        }
        Poll::Pending
    }
}
