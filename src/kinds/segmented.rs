//! `SegmentedLock`: one name split into N plain locks, so N holders may work at once.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::select_all;
use tokio::time::Instant;

use super::parts::{Parts, give_up};
use crate::client::LockClient;
use crate::engine::wait_bound;
use crate::error::{ErrorKind, LockError, Result};
use crate::guard::{LockGuard, LostSignal};
use crate::keys::{MAX_NAME_LEN, display_name};
use crate::lease::Lease;
use crate::lock::Lock;
use crate::meter::{counted, counted_try};

/// The most segments one segmented lock may have: a holder that waits for any segment
/// waits on all of them at once.
pub const MAX_SEGMENTS: usize = 1024;

/// A hot resource split into N segments, each a plain lock named `<name>#<i>` (`i` from 0):
/// a counter or a stock kept in N parts, so up to N holders work at once, each on its own
/// part. A holder takes any one free segment ([`SegmentedLock::acquire`]) or several
/// ([`SegmentedLock::acquire_many`]) and learns which from its guard.
///
/// Every segment is an ordinary lock of the client: a plain lock named `stock#2` IS
/// segment 2 of `stock`, and operators can inspect or force-unlock segments by that name.
///
/// ```no_run
/// # async fn demo(locks: tower_redis_lock::LockClient) -> Result<(), tower_redis_lock::LockError> {
/// let stock = locks.segmented_lock("stock:sku-42", 8)?;
/// let guard = stock.acquire().await?;
/// let part = guard.segments()[0]; // take from stock part `part` only
/// # let _ = part;
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct SegmentedLock {
    name: Arc<str>,
    /// Segment `i` at index `i`.
    segments: Vec<Lock>,
}

impl fmt::Debug for SegmentedLock {
    /// Short: every segment would repeat the same client.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SegmentedLock")
            .field("name", &self.name)
            .field("segments", &self.segments.len())
            .finish_non_exhaustive()
    }
}

impl LockClient {
    /// The lock `name` split into `segments` segments; see [`SegmentedLock`].
    ///
    /// # Errors
    ///
    /// As [`SegmentedLock::new`].
    pub fn segmented_lock(&self, name: &str, segments: usize) -> Result<SegmentedLock> {
        SegmentedLock::new(self, name, segments)
    }
}

impl SegmentedLock {
    /// The lock `name` of `client` split into `segments` segments, named `<name>#0` to
    /// `<name>#<segments - 1>`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidConfig`] for 0 segments or more than [`MAX_SEGMENTS`], and
    /// [`ErrorKind::InvalidName`] when the name is empty or, with the longest suffix, longer
    /// than [`MAX_NAME_LEN`] bytes.
    pub fn new(client: &LockClient, name: &str, segments: usize) -> Result<Self> {
        if segments == 0 || segments > MAX_SEGMENTS {
            return Err(LockError::new(
                ErrorKind::InvalidConfig,
                format!("a segmented lock has 1 to {MAX_SEGMENTS} segments, not {segments}"),
            ));
        }
        if name.is_empty() {
            return Err(LockError::new(
                ErrorKind::InvalidName,
                "the lock name is empty",
            ));
        }
        let longest = segment_name(name, segments - 1);
        if longest.len() > MAX_NAME_LEN {
            return Err(LockError::new(
                ErrorKind::InvalidName,
                format!(
                    "the segment name '{name}#{}' is {} bytes, over the limit of {MAX_NAME_LEN}",
                    segments - 1,
                    longest.len()
                ),
            ));
        }
        let segments = (0..segments)
            .map(|segment| client.lock(&segment_name(name, segment)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            name: name.into(),
            segments,
        })
    }

    /// The same lock, its segments acquired with `lease` (default [`Lease::Watchdog`]).
    #[must_use]
    pub fn with_lease(mut self, lease: Lease) -> Self {
        self.segments = self
            .segments
            .into_iter()
            .map(|segment| segment.with_lease(lease))
            .collect();
        self
    }

    /// The lock's name (without a segment suffix).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many segments the lock has.
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// Segment `index`'s plain lock, for inspection.
    pub fn segment(&self, index: usize) -> Option<&Lock> {
        self.segments.get(index)
    }

    /// Takes one segment: a free one if any (looking from a random segment on, to spread
    /// holders), or else the first to be freed, however long that takes. Cancel by dropping
    /// the future: nothing stays held or queued.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future releases what it took (in the background) and leaves no
    /// place queued or subscribed.
    ///
    /// # Errors
    ///
    /// The errors of [`Lock::acquire`].
    pub async fn acquire(&self) -> Result<SegmentGuard> {
        self.acquire_many(1).await
    }

    /// [`SegmentedLock::acquire`], waiting at most `wait`.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future releases what it took (in the background) and leaves no
    /// place queued or subscribed.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Timeout`] when `wait` passes first, and the errors of
    /// [`Lock::acquire`].
    pub async fn acquire_timeout(&self, wait: Duration) -> Result<SegmentGuard> {
        self.acquire_many_timeout(1, wait).await
    }

    /// Takes one free segment; `Ok(None)` when every segment is held.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future releases what it took (in the background) and leaves no
    /// place queued or subscribed.
    ///
    /// # Errors
    ///
    /// The errors of [`Lock::try_acquire`].
    pub async fn try_acquire(&self) -> Result<Option<SegmentGuard>> {
        self.try_acquire_many(1).await
    }

    /// Takes `count` distinct segments, however long that takes, without holding some while
    /// waiting for others: it takes what is free, and when that is too few it releases them,
    /// waits until one of the segments it found held is freed, and tries again from there. So holders
    /// of several segments never deadlock, whatever counts they ask for.
    ///
    /// Cancel by dropping the future: nothing stays held or queued.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future releases what it took (in the background) and leaves no
    /// place queued or subscribed.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidConfig`] when `count` is 0 or more than the segments, and the
    /// errors of [`Lock::acquire`].
    pub async fn acquire_many(&self, count: usize) -> Result<SegmentGuard> {
        counted("segmented", self.wait_for_many(count)).await
    }

    async fn wait_for_many(&self, count: usize) -> Result<SegmentGuard> {
        self.check_count(count)?;
        let mut first = None;
        loop {
            let (held, busy) = self.take_free(count, first.take()).await?;
            if held.len() == count {
                return Ok(SegmentGuard::new(held));
            }
            // Too few: hold nothing while waiting, or two holders could wait for each other.
            give_up(held.into_iter().map(|(_, guard)| guard).collect()).await;
            first = Some(self.first_freed(&busy).await?);
        }
    }

    /// [`SegmentedLock::acquire_many`], waiting at most `wait`.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future releases what it took (in the background) and leaves no
    /// place queued or subscribed.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Timeout`] when `wait` passes first
    /// ([`ErrorKind::RestartQuarantine`] when it passes while Redis recovers from a loss of
    /// its data), and the errors of [`SegmentedLock::acquire_many`].
    pub async fn acquire_many_timeout(&self, count: usize, wait: Duration) -> Result<SegmentGuard> {
        let bounded = async {
            self.check_count(count)?;
            match wait_bound::until(Instant::now() + wait, self.wait_for_many(count)).await {
                Ok(acquired) => acquired,
                Err(_) => Err(self.segments[0].client().wait_bound_error(&format!(
                    "{count} of the {} segments of '{}' not acquired within {wait:?}",
                    self.segments.len(),
                    display_name(&self.name)
                ))),
            }
        };
        counted("segmented", bounded).await
    }

    /// Takes `count` free segments; `Ok(None)`, holding none, when fewer are free.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future releases what it took (in the background) and leaves no
    /// place queued or subscribed.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidConfig`] when `count` is 0 or more than the segments, and the
    /// errors of [`Lock::try_acquire`].
    pub async fn try_acquire_many(&self, count: usize) -> Result<Option<SegmentGuard>> {
        counted_try("segmented", self.try_many(count)).await
    }

    async fn try_many(&self, count: usize) -> Result<Option<SegmentGuard>> {
        self.check_count(count)?;
        let (held, _busy) = self.take_free(count, None).await?;
        if held.len() == count {
            return Ok(Some(SegmentGuard::new(held)));
        }
        give_up(held.into_iter().map(|(_, guard)| guard).collect()).await;
        Ok(None)
    }

    fn check_count(&self, count: usize) -> Result<()> {
        if count == 0 || count > self.segments.len() {
            return Err(LockError::new(
                ErrorKind::InvalidConfig,
                format!(
                    "'{}' has {} segments: cannot take {count}",
                    self.name,
                    self.segments.len()
                ),
            ));
        }
        Ok(())
    }

    /// Takes free segments, starting with `first` (already held) and then from a random
    /// segment on, until `count` are held; returns them and the segments found busy.
    async fn take_free(
        &self,
        count: usize,
        first: Option<(usize, LockGuard)>,
    ) -> Result<(Vec<(usize, LockGuard)>, Vec<usize>)> {
        let total = self.segments.len();
        let mut held: Vec<(usize, LockGuard)> = first.into_iter().collect();
        let mut busy = Vec::new();
        let start = rand::random_range(0..total);
        for segment in (start..total).chain(0..start) {
            if held.len() == count {
                break;
            }
            if held.iter().any(|(taken, _)| *taken == segment) {
                continue;
            }
            match self.segments[segment].try_acquire_part().await {
                Ok(Some(guard)) => held.push((segment, guard)),
                Ok(None) => busy.push(segment),
                Err(err) => {
                    give_up(held.into_iter().map(|(_, guard)| guard).collect()).await;
                    return Err(err);
                }
            }
        }
        Ok((held, busy))
    }

    /// Waits on every segment of `among` at once and keeps the first granted; dropping the
    /// other waits gives their places back (and releases a grant that raced in).
    async fn first_freed(&self, among: &[usize]) -> Result<(usize, LockGuard)> {
        debug_assert!(
            !among.is_empty(),
            "too few free segments means some are busy"
        );
        let waits = among.iter().map(|&segment| {
            let lock = &self.segments[segment];
            Box::pin(async move { (segment, lock.acquire_part().await) })
        });
        let ((segment, acquired), _, _others) = select_all(waits).await;
        Ok((segment, acquired?))
    }
}

/// The lock name of segment `index` of `name`.
fn segment_name(name: &str, index: usize) -> String {
    format!("{name}#{index}")
}

/// Proof of holding one or more segments of a [`SegmentedLock`]. Release it with
/// [`SegmentGuard::release`] to see the result; dropping it releases every segment in the
/// background.
#[derive(Debug)]
#[must_use = "dropping the guard releases the segments at once"]
pub struct SegmentGuard {
    segments: Vec<usize>,
    parts: Parts,
}

impl SegmentGuard {
    fn new(mut held: Vec<(usize, LockGuard)>) -> Self {
        held.sort_by_key(|(segment, _)| *segment);
        let (segments, guards): (Vec<usize>, Vec<LockGuard>) = held.into_iter().unzip();
        let all = guards.len();
        Self {
            segments,
            parts: Parts::new(guards, all),
        }
    }

    /// Which segments this guard holds, in ascending order.
    pub fn segments(&self) -> &[usize] {
        &self.segments
    }

    /// The guard of each segment, in the order of [`SegmentGuard::segments`].
    pub fn guards(&self) -> &[LockGuard] {
        self.parts.guards()
    }

    /// The fencing token of each segment, in the order of [`SegmentGuard::segments`]; each
    /// segment counts its own.
    pub fn fencing_tokens(&self) -> Vec<u64> {
        self.guards().iter().map(LockGuard::fencing_token).collect()
    }

    /// A signal that fires as soon as any of the segments is lost, with its reason.
    pub fn lost_signal(&self) -> LostSignal {
        self.parts.lost_signal()
    }

    /// Whether every segment is still held, as far as this process knows.
    pub fn is_held(&self) -> bool {
        self.parts.is_held()
    }

    /// Releases every segment (in parallel) and waits for Redis to confirm each.
    ///
    /// # Cancel safety
    ///
    /// Cancelling the call leaves the release to finish in the background, as a dropped guard's
    /// does.
    ///
    /// # Errors
    ///
    /// The first error of [`LockGuard::release`], in segment order; every segment is
    /// released all the same.
    pub async fn release(self) -> Result<()> {
        self.parts.release().await
    }
}
