//! Singleton tasks: a task that runs on one instance of a service at a time, told to stop and
//! dropped before another instance can start it.
//!
//! ```no_run
//! # async fn demo() -> tower_redis_lock::Result<()> {
//! use std::time::Duration;
//! use tower_redis_lock::LockClient;
//!
//! let locks = LockClient::connect("redis://127.0.0.1:6379").await?;
//! let reconcile = locks
//!     .singleton("reconcile")?
//!     .grace(Duration::from_secs(2))
//!     .spawn(|leadership| async move {
//!         loop {
//!             tokio::select! {
//!                 _ = leadership.stopping() => return,
//!                 () = tokio::time::sleep(Duration::from_secs(1)) => {
//!                     // One step of the work, fenced by `leadership.term()`.
//!                 }
//!             }
//!         }
//!     });
//! // On SIGTERM: stop the task and hand the leadership to the next instance at once.
//! reconcile.shutdown().await?;
//! # Ok(()) }
//! ```
//!
//! Every instance that runs the same singleton is a candidate: it waits in the queue of the
//! fair lock of that name (woken by pub/sub, no polling), leads while it holds the lock (its
//! watchdog renews the lease as long as the task runs) and gives the task a [`Leadership`]:
//! its term (the lock's fencing token, greater for every new leadership), the signal to stop,
//! and writes Redis applies only while this instance leads. The chapter
//! [`crate::guide::singleton`] says what "before another instance starts" rests on and how
//! this compares with Kubernetes' leader election and ShedLock.

mod campaign;
mod leadership;
mod schedule;
mod term;
mod within_lease;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::client::LockClient;
use crate::error::{ErrorKind, LockError, Result};
use crate::lock::Lock;
use crate::meter::start_leadership_at_zero;

pub use leadership::{Leadership, StopReason};
pub use schedule::{MIN_PERIOD, Overrun, Schedule, Tick};

/// How long a task told to stop may take to return before it is dropped, unless the lease
/// runs out first.
pub const DEFAULT_STOP_GRACE: Duration = Duration::from_secs(5);

/// What a candidate does when its task returns while it leads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum AfterTaskEnd {
    /// Hand the leadership over and campaign again, behind the candidates already waiting
    /// (the default): the task runs again on whichever instance leads next.
    #[default]
    Campaign,
    /// Hand the leadership over and stop campaigning: the run ends.
    Resign,
}

/// A task that runs on one instance at a time, and its settings. Made by
/// [`LockClient::singleton`]; started by [`Singleton::spawn`] or [`Singleton::run_until`].
#[derive(Debug, Clone)]
pub struct Singleton {
    lock: Lock,
    grace: Duration,
    after_task_ends: AfterTaskEnd,
}

impl LockClient {
    /// The singleton task called `name`: candidates of every instance that use this name
    /// lead one at a time. Its lock is the fair lock `name` (which `lockctl inspect` shows
    /// with its leader and the candidates in line), held with the watchdog's lease.
    ///
    /// # Errors
    ///
    /// As [`LockClient::lock`].
    pub fn singleton(&self, name: &str) -> Result<Singleton> {
        let lock = self.fair_lock(name)?;
        start_leadership_at_zero(name);
        Ok(Singleton {
            lock,
            grace: DEFAULT_STOP_GRACE,
            after_task_ends: AfterTaskEnd::default(),
        })
    }
}

impl Singleton {
    /// The singleton's name.
    pub fn name(&self) -> &str {
        self.lock.name()
    }

    /// How long a task told to stop ([`Leadership::stopping`]) may take to return before it
    /// is dropped ([`DEFAULT_STOP_GRACE`] by default). When the lease was lost, the task is
    /// dropped at the lease's end if that comes first: at most a tenth of the watchdog lease
    /// after it was told.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// What to do when the task returns while this instance leads.
    pub fn after_task_ends(mut self, after: AfterTaskEnd) -> Self {
        self.after_task_ends = after;
        self
    }

    /// Campaigns and runs `task` in every term this instance wins, until `shutdown` resolves
    /// (the task is then told to stop and the leadership handed over), the client is shut
    /// down, or the task returns under [`AfterTaskEnd::Resign`]. A campaign that fails
    /// (Redis unreachable) is tried again after a pause that grows to 5 s.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::AccessDenied`] when Redis refuses this client, and
    /// [`ErrorKind::InvalidConfig`] for a client whose settings no lock can be taken with:
    /// campaigning again would not help.
    pub async fn run_until<F, Fut>(self, shutdown: impl Future<Output = ()>, task: F) -> Result<()>
    where
        F: FnMut(Leadership) -> Fut,
        Fut: Future<Output = ()>,
    {
        campaign::campaign(self, shutdown, task).await
    }

    /// Runs [`Singleton::run_until`] on a task of its own, until
    /// [`SingletonHandle::shutdown`] (or the handle's drop).
    pub fn spawn<F, Fut>(self, task: F) -> SingletonHandle
    where
        F: FnMut(Leadership) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        SingletonHandle::start(|shutdown| self.run_until(shutdown, task))
    }
}

/// A singleton task or a schedule started by [`Singleton::spawn`] or [`Schedule::spawn`].
/// Dropping it shuts it down in the background, as [`SingletonHandle::shutdown`] does.
#[derive(Debug)]
#[must_use = "dropping the handle shuts the singleton down"]
pub struct SingletonHandle {
    stop: Option<oneshot::Sender<()>>,
    running: JoinHandle<Result<()>>,
}

/// Resolves when a [`SingletonHandle`] is shut down or dropped.
#[derive(Debug)]
pub(crate) struct ShutdownSignal(oneshot::Receiver<()>);

impl Future for ShutdownSignal {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // Sent or dropped: either way the run ends.
        Pin::new(&mut self.0).poll(cx).map(|_| ())
    }
}

impl SingletonHandle {
    /// Spawns the run `start` makes from the handle's shutdown signal.
    pub(crate) fn start<R>(start: impl FnOnce(ShutdownSignal) -> R) -> Self
    where
        R: Future<Output = Result<()>> + Send + 'static,
    {
        let (stop, stopped) = oneshot::channel();
        Self {
            stop: Some(stop),
            running: tokio::spawn(start(ShutdownSignal(stopped))),
        }
    }

    /// Stops campaigning; if this instance leads, tells the task to stop, waits for it
    /// (up to the grace) and hands the leadership to the next candidate at once, without
    /// waiting out a lease. Returns once the leadership is released.
    ///
    /// # Errors
    ///
    /// As [`Singleton::run_until`]. A panic of the task is raised again here.
    pub async fn shutdown(mut self) -> Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match (&mut self.running).await {
            Ok(ended) => ended,
            Err(failed) if failed.is_panic() => std::panic::resume_unwind(failed.into_panic()),
            Err(_) => Err(LockError::new(
                ErrorKind::ShutDown,
                "the runtime shut down before the singleton stopped",
            )),
        }
    }

    /// Whether the singleton stopped on its own: the client shut down, a task returned
    /// under [`AfterTaskEnd::Resign`], or an error ended it.
    pub fn is_finished(&self) -> bool {
        self.running.is_finished()
    }
}
