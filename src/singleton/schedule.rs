//! Scheduled jobs: a job every period, run at most once per tick across every instance, the
//! ticks read from the server's clock.

use std::future::Future;
use std::pin::{Pin, pin};
use std::time::Duration;

use tokio::time::{Instant, sleep_until};
use tracing::{info_span, warn};

use crate::client::LockClient;
use crate::error::{ErrorKind, LockError, Result};
use crate::guard::LockGuard;
use crate::lease::MAX_LEASE;
use crate::lock::Lock;
use crate::meter::{TickOutcome, start_ticks_at_zero, ticks};
use crate::singleton::leadership::Leadership;
use crate::singleton::term::{RETRY_FIRST, RETRY_MOST, TermEnd, gives_up_on, run_term, step_down};
use crate::singleton::{DEFAULT_STOP_GRACE, SingletonHandle};
use crate::singleton_records::{ClaimMode, ClaimStatus, TickReply};

/// The shortest period a schedule accepts: each tick costs every instance a lock.
pub const MIN_PERIOD: Duration = Duration::from_millis(100);

/// What becomes of the ticks that come while the job of an earlier tick still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Overrun {
    /// They are not run, and counted as skipped (the default): the next job starts at the
    /// first tick that begins after the long one ended.
    #[default]
    Skip,
    /// The last of them runs as soon as the long job ends, on the instance that ran it; the
    /// ones before it are counted as skipped.
    Wait,
}

/// A job that runs every period on one instance, at most once per tick. Made by
/// [`LockClient::schedule`].
#[derive(Debug, Clone)]
pub struct Schedule {
    lock: Lock,
    period: Duration,
    overrun: Overrun,
    grace: Duration,
}

/// One tick of a schedule, given to its job.
#[derive(Debug, Clone)]
pub struct Tick {
    number: u64,
    missed_before: u64,
    leadership: Leadership,
}

impl Tick {
    /// The tick's number: the server's time in ms over the period, so tick `n` began at
    /// `n × period` on the server's clock.
    pub fn number(&self) -> u64 {
        self.number
    }

    /// The ticks before this one that no instance ran since the last that was run or
    /// skipped (every instance down, or a runner that lost its lock): counted once, here.
    pub fn missed_before(&self) -> u64 {
        self.missed_before
    }

    /// The lock this tick runs under: its term (fencing token), the signal to stop, and
    /// writes Redis applies only while it is held.
    pub fn leadership(&self) -> &Leadership {
        &self.leadership
    }
}

impl LockClient {
    /// The schedule `name`, a job every `period`: at each tick (the server's clock in ms
    /// over the period), the instances that run it take its fair lock in turn, and the
    /// first claims the tick and runs the job; the others find it claimed. A job that
    /// outlives its period keeps the lock (the watchdog renews it); see [`Overrun`].
    ///
    /// # Errors
    ///
    /// As [`LockClient::lock`]; [`ErrorKind::InvalidConfig`] for a period under
    /// [`MIN_PERIOD`] or over [`MAX_LEASE`].
    pub fn schedule(&self, name: &str, period: Duration) -> Result<Schedule> {
        if !(MIN_PERIOD..=MAX_LEASE).contains(&period) {
            return Err(LockError::new(
                ErrorKind::InvalidConfig,
                format!(
                    "a schedule's period must be from {MIN_PERIOD:?} to a year, not {period:?}"
                ),
            ));
        }
        let lock = self.fair_lock(name)?;
        start_ticks_at_zero(name);
        Ok(Schedule {
            lock,
            period,
            overrun: Overrun::default(),
            grace: DEFAULT_STOP_GRACE,
        })
    }
}

impl Schedule {
    /// The schedule's name.
    pub fn name(&self) -> &str {
        self.lock.name()
    }

    /// What becomes of the ticks that come while a job still runs ([`Overrun::Skip`] by
    /// default).
    pub fn overrun(mut self, overrun: Overrun) -> Self {
        self.overrun = overrun;
        self
    }

    /// How long a job told to stop may take to return before it is dropped, as
    /// [`Singleton::grace`](crate::singleton::Singleton::grace).
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Runs `job` at the ticks this instance claims, until `shutdown` resolves (a running
    /// job is told to stop, and the lock handed over) or the client shuts down. An attempt
    /// that fails (Redis unreachable) is tried again after a pause that grows to 5 s.
    ///
    /// # Errors
    ///
    /// As [`Singleton::run_until`](crate::singleton::Singleton::run_until).
    pub async fn run_until<F, Fut>(
        self,
        shutdown: impl Future<Output = ()>,
        mut job: F,
    ) -> Result<()>
    where
        F: FnMut(Tick) -> Fut,
        Fut: Future<Output = ()>,
    {
        let mut shutdown = pin!(shutdown);
        let mut clock = ServerClock::default();
        let mut next = Instant::now();
        let mut retry = RETRY_FIRST;
        loop {
            tokio::select! {
                biased;
                () = &mut shutdown => return Ok(()),
                () = sleep_until(next) => {}
            }
            let taken = tokio::select! {
                biased;
                () = &mut shutdown => return Ok(()),
                taken = self.take_lock() => taken,
            };
            let outcome = match taken {
                Ok(Some(guard)) => {
                    self.claim_and_run(guard, &mut job, shutdown.as_mut(), &mut clock)
                        .await
                }
                Ok(None) => Ok(TermEnd::TaskEnded),
                Err(error) => Err(error),
            };
            match outcome {
                Ok(TermEnd::ShutDown) => return Ok(()),
                Ok(_) => {
                    retry = RETRY_FIRST;
                    next = clock.next_tick(self.period);
                }
                Err(error) if error.kind() == ErrorKind::ShutDown => return Ok(()),
                Err(error) if gives_up_on(error.kind()) => return Err(error),
                Err(error) => {
                    warn!(name = self.name(), %error, pause = ?retry, "a tick failed; trying again");
                    next = Instant::now() + retry;
                    retry = (retry * 2).min(RETRY_MOST);
                }
            }
        }
    }

    /// Runs [`Schedule::run_until`] on a task of its own, until
    /// [`SingletonHandle::shutdown`] (or the handle's drop).
    pub fn spawn<F, Fut>(self, job: F) -> SingletonHandle
    where
        F: FnMut(Tick) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        SingletonHandle::start(|shutdown| self.run_until(shutdown, job))
    }

    /// Takes the schedule's lock for this tick: waits in line under [`Overrun::Wait`]; under
    /// [`Overrun::Skip`] only if it is free, as a held lock means the tick is being run (or
    /// overrun) elsewhere.
    async fn take_lock(&self) -> Result<Option<LockGuard>> {
        match self.overrun {
            Overrun::Wait => self.lock.acquire().await.map(Some),
            Overrun::Skip => self.lock.try_acquire().await,
        }
    }

    /// Claims the current tick under `guard` and runs the job if it is this instance's; then
    /// accounts for the ticks the job overran, and gives the lock up.
    async fn claim_and_run<F, Fut>(
        &self,
        guard: LockGuard,
        job: &mut F,
        mut shutdown: Pin<&mut impl Future<Output = ()>>,
        clock: &mut ServerClock,
    ) -> Result<TermEnd>
    where
        F: FnMut(Tick) -> Fut,
        Fut: Future<Output = ()>,
    {
        let name = self.name();
        let span = info_span!("tick", name, term = guard.fencing_token());
        let mut claimed = self.claim(&guard, ClaimMode::Run, clock).await?;
        let mut held = Some(guard);
        let mut missed_before = claimed.passed;
        let mut end = TermEnd::TaskEnded;
        while claimed.status == ClaimStatus::Run {
            let Some(guard) = held.take() else { break };
            ticks(name, TickOutcome::Missed, missed_before);
            ticks(name, TickOutcome::Run, 1);
            let tick = claimed.tick;
            let start = |leadership| {
                job(Tick {
                    number: tick,
                    missed_before,
                    leadership,
                })
            };
            (end, held) = run_term(name, guard, start, self.grace, shutdown.as_mut(), &span).await;
            let Some(guard) = held.as_ref().filter(|_| end == TermEnd::TaskEnded) else {
                break;
            };
            // Still held: the ticks that began while the job ran were overrun.
            claimed = match self.overrun {
                Overrun::Skip => self.claim(guard, ClaimMode::Settle, clock).await?,
                Overrun::Wait => self.claim(guard, ClaimMode::Run, clock).await?,
            };
            let overrun = match claimed.status {
                ClaimStatus::Settled => claimed.passed + 1,
                ClaimStatus::Run => claimed.passed,
                _ => 0,
            };
            ticks(name, TickOutcome::Skipped, overrun);
            missed_before = 0;
        }
        match claimed.status {
            ClaimStatus::Unknown => ticks(name, TickOutcome::Skipped, 1),
            // The lease ran out before the claim: nothing to release.
            ClaimStatus::Refused => end = TermEnd::Lost,
            ClaimStatus::Run | ClaimStatus::Settled | ClaimStatus::Done => {}
        }
        step_down(held, end, span.clone()).await;
        Ok(end)
    }

    /// Claims the current tick under `guard`, and sets the clock by the server's answer.
    async fn claim(
        &self,
        guard: &LockGuard,
        mode: ClaimMode,
        clock: &mut ServerClock,
    ) -> Result<TickReply> {
        let reply = guard.claim_tick(self.period, mode).await?;
        clock.set(Instant::now(), reply.server_ms);
        Ok(reply)
    }
}

/// The server's clock as this process last read it: a moment of the local monotonic clock
/// and the server's ms then, so a tick's start on the server's clock maps to a local moment
/// (an instance's own wall clock, however far off, plays no part).
#[derive(Debug, Default, Clone, Copy)]
struct ServerClock {
    read: Option<(Instant, u64)>,
}

impl ServerClock {
    /// Records that the server's clock read `server_ms` when its answer came, at
    /// `answered`: the server read it earlier, so a tick is awaited a round trip late at
    /// most, never early.
    fn set(&mut self, answered: Instant, server_ms: u64) {
        self.read = Some((answered, server_ms));
    }

    /// The local moment the next tick begins on the server's clock; when the server was
    /// never read (the lock was busy at each try), a period from now, or 5 s when the period
    /// is longer, to try again.
    fn next_tick(&self, period: Duration) -> Instant {
        let Some((read_at, server_ms)) = self.read else {
            return Instant::now() + period.min(RETRY_MOST);
        };
        let period_ms = u64::try_from(period.as_millis()).unwrap_or(u64::MAX).max(1);
        let next_ms = (server_ms / period_ms + 1) * period_ms;
        read_at + Duration::from_millis(next_ms - server_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_tick_is_awaited_by_the_servers_clock_and_a_clock_never_read_retries_soon() {
        let answered = Instant::now();
        let mut clock = ServerClock::default();
        clock.set(answered, 12_345);
        let period = Duration::from_secs(1);
        assert_eq!(
            clock.next_tick(period),
            answered + Duration::from_millis(655)
        );
        clock.set(answered, 13_000);
        assert_eq!(
            clock.next_tick(period),
            answered + period,
            "a tick that just began"
        );

        let never = ServerClock::default();
        let soon = never.next_tick(Duration::from_secs(24 * 3600));
        assert!(
            soon <= Instant::now() + RETRY_MOST,
            "a day's period retries within 5 s"
        );
        assert!(soon > answered, "not at once: the lock was busy");
    }
}
