//! The lease actor: ONE task per client renews every watchdog-mode lease this process holds,
//! and fires the lost signal of any lease it can no longer vouch for.
//!
//! Renewals are batched: one multi-key script per tick for every lease (in chunks), not one
//! timer per lock. Each lease has a deadline, the moment Redis may let it go: the time the
//! last successful renewal (or the acquisition) was sent plus the lease. A renewal that finds
//! the lock gone or owned by another fires `Taken`; a deadline that passes without a
//! successful renewal fires `Unreachable` (or `Expired` for a fixed lease, which is never
//! renewed). Nothing is only logged.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, sleep_until, timeout};

use crate::conn::Connections;
use crate::guard::{LeaseState, LostReason};
use crate::keys::LockKeys;
use crate::scripts::{self, ReleaseScope};

/// Locks renewed by one script call.
const BATCH: usize = 500;

/// One held lock, as the watchdog tracks it.
#[derive(Debug)]
pub(crate) struct Registration {
    pub(crate) id: u64,
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) owner: Arc<str>,
    pub(crate) lease: Arc<LeaseState>,
    /// Renewed by the watchdog (true) or a fixed lease that runs out (false).
    pub(crate) renew: bool,
    /// When Redis may drop the lock unless it is renewed first.
    pub(crate) expires_at: Instant,
}

#[derive(Debug)]
enum Command {
    Register(Registration),
    Unregister(u64),
    Shutdown(oneshot::Sender<()>),
}

/// Handle on the lease actor. The actor ends when the last handle is dropped.
#[derive(Debug, Clone)]
pub(crate) struct Watchdog {
    commands: mpsc::UnboundedSender<Command>,
}

impl Watchdog {
    /// Spawns the actor on the current runtime: every `tick` it renews the leases that are
    /// `renew_interval` old, and any lease with less than a full lease left (a hand-over's
    /// claim lease).
    pub(crate) fn start(
        connections: Arc<Connections>,
        wake_prefix: String,
        lease: Duration,
        renew_interval: Duration,
        tick: Duration,
    ) -> Self {
        let (commands, receiver) = mpsc::unbounded_channel();
        let actor = Actor {
            connections,
            wake_prefix,
            lease,
            renew_interval,
            tick,
            commands: receiver,
            entries: HashMap::new(),
            deadlines: BTreeSet::new(),
        };
        tokio::spawn(actor.run());
        Self { commands }
    }

    pub(crate) fn register(&self, registration: Registration) {
        if let Err(refused) = self.commands.send(Command::Register(registration)) {
            // The actor has stopped (shutdown): nobody will vouch for this lease.
            if let Command::Register(registration) = refused.0 {
                registration
                    .lease
                    .fire(registration.keys.hash(), LostReason::ShutDown);
            }
        }
    }

    pub(crate) fn unregister(&self, id: u64) {
        let _ = self.commands.send(Command::Unregister(id));
    }

    /// Releases every lock still registered, fires their lost signals, and stops the actor.
    pub(crate) async fn shutdown(&self) {
        let (done, finished) = oneshot::channel();
        if self.commands.send(Command::Shutdown(done)).is_ok() {
            let _ = finished.await;
        }
    }
}

struct Actor {
    connections: Arc<Connections>,
    /// Releases at shutdown hand the lock to the next waiting instance.
    wake_prefix: String,
    lease: Duration,
    renew_interval: Duration,
    tick: Duration,
    commands: mpsc::UnboundedReceiver<Command>,
    entries: HashMap<u64, Registration>,
    deadlines: BTreeSet<(Instant, u64)>,
}

impl Actor {
    async fn run(mut self) {
        let mut tick = tokio::time::interval_at(Instant::now() + self.tick, self.tick);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let next_deadline = self.deadlines.first().map(|(at, _)| *at);
            tokio::select! {
                command = self.commands.recv() => match command {
                    None => break,
                    Some(Command::Shutdown(done)) => {
                        self.release_all().await;
                        let _ = done.send(());
                        break;
                    }
                    Some(command) => self.apply(command),
                },
                _ = tick.tick() => self.renew().await,
                _ = sleep_until(next_deadline.unwrap_or_else(Instant::now)),
                    if next_deadline.is_some() => self.expire(Instant::now()),
            }
        }
    }

    fn apply(&mut self, command: Command) {
        match command {
            Command::Register(registration) => {
                self.deadlines
                    .insert((registration.expires_at, registration.id));
                self.entries.insert(registration.id, registration);
            }
            Command::Unregister(id) => {
                if let Some(entry) = self.entries.remove(&id) {
                    self.deadlines.remove(&(entry.expires_at, id));
                }
            }
            Command::Shutdown(_) => unreachable!("handled by run"),
        }
    }

    /// Applies the commands that arrived while a renewal was in flight, so a lock released
    /// meanwhile is not reported lost.
    fn drain_commands(&mut self) -> Option<oneshot::Sender<()>> {
        while let Ok(command) = self.commands.try_recv() {
            match command {
                Command::Shutdown(done) => return Some(done),
                command => self.apply(command),
            }
        }
        None
    }

    async fn renew(&mut self) {
        // Due: renewed at least `renew_interval` ago, i.e. less than `lease - renew_interval`
        // left; the deadlines are ordered, so only the due ones are visited.
        let due = Instant::now() + self.lease.saturating_sub(self.renew_interval);
        let batch: Vec<(u64, Arc<LockKeys>, Arc<str>)> = self
            .deadlines
            .iter()
            .take_while(|(at, _)| *at <= due)
            .filter_map(|(_, id)| self.entries.get(id))
            .filter(|entry| entry.renew)
            .map(|entry| (entry.id, entry.keys.clone(), entry.owner.clone()))
            .collect();
        let lease_ms = self.lease.as_millis() as u64;
        // A renewal that takes longer than the interval is no use; the deadline takes over.
        let limit = self.connections.command_timeout().min(self.renew_interval);
        for chunk in batch.chunks(BATCH) {
            let sent_at = Instant::now();
            let pairs: Vec<(&str, &str)> = chunk
                .iter()
                .map(|(_, keys, owner)| (keys.hash(), &**owner))
                .collect();
            let outcome = timeout(limit, async {
                let mut conn = self.connections.get().await?;
                self.connections.note_sent();
                Ok::<_, crate::LockError>(scripts::renew(&mut conn, &pairs, lease_ms).await?)
            })
            .await;
            let shutdown = self.drain_commands();
            match outcome {
                Ok(Ok(renewed)) => {
                    for ((id, _, _), held) in chunk.iter().zip(renewed) {
                        if held {
                            self.extend(*id, sent_at + self.lease);
                        } else {
                            self.fire(*id, LostReason::Taken);
                        }
                    }
                }
                Ok(Err(err)) => {
                    self.connections.note_failure(&err);
                    tracing::warn!(error = %err, locks = chunk.len(), "lease renewal failed");
                }
                Err(_) => {
                    self.connections
                        .note_failure(&crate::LockError::command_timeout());
                    tracing::warn!(locks = chunk.len(), "lease renewal timed out");
                }
            }
            if let Some(done) = shutdown {
                // Shutdown arrived mid-renewal: finish it here; the closed queue ends `run`.
                self.release_all().await;
                let _ = done.send(());
                self.commands.close();
                return;
            }
        }
    }

    fn extend(&mut self, id: u64, expires_at: Instant) {
        if let Some(entry) = self.entries.get_mut(&id) {
            self.deadlines.remove(&(entry.expires_at, id));
            entry.expires_at = expires_at;
            self.deadlines.insert((expires_at, id));
        }
    }

    fn fire(&mut self, id: u64, reason: LostReason) {
        if let Some(entry) = self.entries.remove(&id) {
            self.deadlines.remove(&(entry.expires_at, id));
            entry.lease.fire(entry.keys.hash(), reason);
        }
    }

    fn expire(&mut self, now: Instant) {
        while let Some(&(at, id)) = self.deadlines.first() {
            if at > now {
                break;
            }
            let reason = match self.entries.get(&id) {
                Some(entry) if entry.renew => LostReason::Unreachable,
                _ => LostReason::Expired,
            };
            self.fire(id, reason);
        }
    }

    async fn release_all(&mut self) {
        let entries: Vec<Registration> = self.entries.drain().map(|(_, entry)| entry).collect();
        self.deadlines.clear();
        let connections = &self.connections;
        let wake_prefix = self.wake_prefix.as_str();
        join_all(entries.iter().map(|entry| async move {
            let released = connections
                .run(|mut conn| async move {
                    scripts::release(
                        &mut conn,
                        &entry.keys,
                        wake_prefix,
                        &entry.owner,
                        ReleaseScope::All,
                    )
                    .await
                })
                .await;
            if let Err(err) = released {
                tracing::warn!(lock = entry.keys.hash(), error = %err, "release at shutdown failed");
            }
            entry.lease.fire(entry.keys.hash(), LostReason::ShutDown);
        }))
        .await;
    }
}
