//! Terms of leadership as the candidates' tasks saw them, and the check that no two
//! overlapped: what the singleton tests share.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tower_redis_lock::Leadership;
use tower_redis_lock::singleton::StopReason;

/// One term as a candidate's task saw it: from its first poll to its drop.
#[derive(Debug, Clone)]
pub struct Interval {
    pub candidate: usize,
    pub term: u64,
    pub started: Instant,
    pub told: Option<(Instant, StopReason)>,
    pub ended: Option<Instant>,
}

/// Every term of every candidate, in the order they started.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    intervals: Arc<Mutex<Vec<Interval>>>,
    started: Arc<tokio::sync::Notify>,
}

impl Timeline {
    /// Records a term's start and returns what records its end when dropped.
    pub fn begin(&self, candidate: usize, leadership: &Leadership) -> TermRecord {
        let mut intervals = self.intervals.lock().unwrap();
        intervals.push(Interval {
            candidate,
            term: leadership.term(),
            started: Instant::now(),
            told: None,
            ended: None,
        });
        self.started.notify_waiters();
        TermRecord {
            timeline: self.clone(),
            index: intervals.len() - 1,
        }
    }

    pub fn snapshot(&self) -> Vec<Interval> {
        self.intervals.lock().unwrap().clone()
    }

    /// The candidate leading now (a term started and not ended), waiting up to `bound` for
    /// one whose term started after `after` terms.
    pub async fn leader_after(&self, after: usize, bound: Duration) -> Interval {
        let deadline = Instant::now() + bound;
        loop {
            let started = self.started.notified();
            let terms = self.snapshot();
            if terms.len() > after {
                return terms[after].clone();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                tokio::time::timeout(left, started).await.is_ok(),
                "no term {} started within {bound:?}: {terms:#?}",
                after + 1
            );
        }
    }

    /// Checks that no two terms overlapped (each ended before the next started) and that
    /// terms only grew.
    pub fn assert_one_at_a_time(&self) {
        let terms = self.snapshot();
        for pair in terms.windows(2) {
            let (before, after) = (&pair[0], &pair[1]);
            let ended = before
                .ended
                .unwrap_or_else(|| panic!("a term still ran when the next started: {terms:#?}"));
            assert!(
                ended <= after.started,
                "two leaders at once: {before:?} ended after {after:?} started"
            );
            assert!(
                after.term > before.term,
                "terms must grow: {before:?} then {after:?}"
            );
        }
    }
}

/// Records a term's end when the task is dropped or returns.
pub struct TermRecord {
    timeline: Timeline,
    index: usize,
}

impl TermRecord {
    pub fn told(&self, reason: StopReason) {
        self.timeline.intervals.lock().unwrap()[self.index].told = Some((Instant::now(), reason));
    }
}

impl Drop for TermRecord {
    fn drop(&mut self) {
        self.timeline.intervals.lock().unwrap()[self.index].ended = Some(Instant::now());
    }
}

/// A task that leads until told to stop, and stops at once when told.
pub fn cooperative(
    timeline: &Timeline,
    candidate: usize,
) -> impl FnMut(Leadership) -> futures_util::future::BoxFuture<'static, ()> + Send + 'static {
    recorded_task(timeline, candidate, false)
}

/// A task that never stops on its own: only being dropped ends it.
pub fn stubborn(
    timeline: &Timeline,
    candidate: usize,
) -> impl FnMut(Leadership) -> futures_util::future::BoxFuture<'static, ()> + Send + 'static {
    recorded_task(timeline, candidate, true)
}

/// A task that records its term in `timeline`, and when it is told to stop returns, or
/// (`ignores_stop`) waits to be dropped.
fn recorded_task(
    timeline: &Timeline,
    candidate: usize,
    ignores_stop: bool,
) -> impl FnMut(Leadership) -> futures_util::future::BoxFuture<'static, ()> + Send + 'static {
    let timeline = timeline.clone();
    move |leadership| {
        let timeline = timeline.clone();
        Box::pin(async move {
            let record = timeline.begin(candidate, &leadership);
            let reason = leadership.stopping().await;
            record.told(reason);
            if ignores_stop {
                std::future::pending::<()>().await;
            }
        })
    }
}
