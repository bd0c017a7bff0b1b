//! The lease actor: ONE task per client renews every watchdog-mode lease this process holds,
//! and fires the lost signal of any lease it can no longer vouch for.
//!
//! Renewals are batched: one multi-key script per tick for every lease that is due (in
//! chunks), not one timer per lock. Each lease has a deadline, a tenth of the lease before
//! Redis may let it go, counted from when the last successful renewal (or the acquisition)
//! was sent. A renewal that finds the lock gone or owned by another fires `Taken`; a deadline
//! that passes without a successful renewal fires `Unreachable` (or `Expired` for a fixed
//! lease, which is never renewed), even while a renewal is still on its way. Every renewal,
//! and a look of its own on ticks with nothing due, checks the server's epoch: a Redis that
//! lost its data fires `DataLost` on every lease. Nothing is only logged.
//!
//! Leases are registered and unregistered in a table shared with the actor, so taking and
//! releasing a lock never wakes it; only a deadline earlier than the one it sleeps towards
//! does.
//!
//! The actor is also the heartbeat of this client's waiters: every tick, one script extends
//! the liveness of every place they hold in a Redis queue. A waiter whose process dies stops
//! being extended, and leaves its queue when its liveness runs out; a live one is never
//! evicted, however long it waits.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::join_all;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::{Instant, sleep_until, timeout};

use crate::engine::config::Config;
use crate::engine::deadlines::{Leases, Registration, lost_deadline};
use crate::engine::epoch::Epoch;
use crate::error::{ErrorKind, LockError};
use crate::keys::{LockKeys, display_name};
use crate::lease::{Lease, LostReason};
use crate::meter::{self, Renewal};
use crate::scopes::Placement;
use crate::wire::conn::{Conn, Connections};
use crate::wire::scripts::{self, ReleaseScope, RenewReply};

/// Locks renewed by one script call.
const BATCH: usize = 500;
/// Renewals of one chunk per tick at most: the first may only teach the epoch (see
/// `WatchdogActor::renew_scope`).
const RENEWAL_ATTEMPTS: usize = 2;

/// A lease due for renewal: its watchdog id, its lock's keys and its owner.
type Due = (u64, Arc<LockKeys>, Arc<str>);

/// A place in a queue the heartbeat keeps alive: its lock's keys and its owner id.
type QueuedPlace = (Arc<LockKeys>, Arc<str>);

/// A place a waiter of this client holds in a lock's Redis queue.
#[derive(Debug)]
struct Place {
    keys: Arc<LockKeys>,
    owner: Arc<str>,
}

#[derive(Debug)]
struct WatchdogState {
    leases: Mutex<Leases>,
    /// Places kept alive by the heartbeat, by waiter.
    places: Mutex<HashMap<u64, Place>>,
    earlier_deadline: Notify,
    /// Whose data the leases live in: a new epoch ends them all.
    epoch: Epoch,
}

impl WatchdogState {
    /// Learns the epoch a script told of `scope`, and fires `DataLost` on every lease of an
    /// earlier one there (every lease on one server; the slot's on a cluster).
    fn learn_epoch(&self, scope: u16, epoch: u64, longest_lease_ms: u64) {
        let lost = self.epoch.learn(scope, epoch, longest_lease_ms, || {
            let mut leases = self.leases.lock().expect("leases");
            let gone: Vec<u64> = leases
                .entries
                .values()
                .filter(|entry| self.epoch.scope_of(&entry.keys) == scope)
                .map(|entry| entry.id)
                .collect();
            gone.into_iter()
                .filter_map(|id| leases.remove(id))
                .collect::<Vec<_>>()
        });
        let Some(lost) = lost else {
            return;
        };
        tracing::warn!(
            epoch,
            scope,
            held = lost.len(),
            "Redis lost its data (its epoch changed): every lock held there before is gone, \
             and this client's holders are told (LostReason::DataLost)"
        );
        for entry in lost {
            entry
                .lease_state
                .fire(entry.keys.hash(), LostReason::DataLost);
        }
    }
}

/// The watchdog's clock: named, as four durations side by side are easily swapped.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WatchdogTiming {
    /// The lease a renewal gives (the client's watchdog lease).
    pub(crate) lease: Duration,
    /// How old a lease is when it is renewed.
    pub(crate) renew_interval: Duration,
    /// How often the actor looks for what is due.
    pub(crate) tick: Duration,
    /// How long a refreshed waiting place lives.
    pub(crate) waiter_alive: Duration,
}

impl WatchdogTiming {
    /// The timing `config` asks for: a tick often enough to refresh a waiting place well
    /// before its liveness runs out.
    pub(crate) fn of(config: &Config) -> Self {
        Self {
            lease: config.watchdog_lease,
            renew_interval: config.renew_interval,
            tick: config.renew_interval.min(config.waiter_alive() / 3),
            waiter_alive: config.waiter_alive(),
        }
    }
}

/// Handle on the lease actor. The actor ends when the last handle is dropped.
#[derive(Debug, Clone)]
pub(crate) struct Watchdog {
    shared: Arc<WatchdogState>,
    shutdown: mpsc::UnboundedSender<oneshot::Sender<()>>,
}

impl Watchdog {
    /// Spawns the actor on the current runtime: every `timing.tick` it renews the leases
    /// that are `timing.renew_interval` old, and gives every waiting place
    /// `timing.waiter_alive` more to live.
    pub(crate) fn start(
        connections: Arc<Connections>,
        placement: Arc<Placement>,
        timing: WatchdogTiming,
        epoch: Epoch,
    ) -> Self {
        let (shutdown, receiver) = mpsc::unbounded_channel();
        let shared = Arc::new(WatchdogState {
            leases: Mutex::default(),
            places: Mutex::default(),
            earlier_deadline: Notify::new(),
            epoch,
        });
        let actor = WatchdogActor {
            connections,
            placement,
            timing,
            shared: shared.clone(),
            shutdown: receiver,
        };
        tokio::spawn(actor.run());
        Self { shared, shutdown }
    }

    /// Watches `registration`'s lease from now on; its deadline becomes the lease's.
    pub(crate) fn register(&self, registration: Registration) {
        registration.lease_state.extend_to(registration.expires_at);
        let (stopped, wake) = {
            let mut leases = self.shared.leases.lock().expect("leases");
            if leases.stopped {
                (Some(registration), false)
            } else {
                (None, leases.insert(registration))
            }
        };
        if let Some(registration) = stopped {
            // The actor has stopped (shutdown): nobody will vouch for this lease.
            registration
                .lease_state
                .fire(registration.keys.hash(), LostReason::ShutDown);
        } else if wake {
            self.shared.earlier_deadline.notify_one();
        }
    }

    /// Keeps waiter `id`'s place in the queue of `keys` alive until [`Watchdog::forget_place`].
    pub(crate) fn keep_place(&self, id: u64, keys: Arc<LockKeys>, owner: Arc<str>) {
        let place = Place { keys, owner };
        self.shared.places.lock().expect("places").insert(id, place);
    }

    /// Stops the heartbeat of waiter `id`'s place (it got the lock, or left).
    pub(crate) fn forget_place(&self, id: u64) {
        let removed = self.shared.places.lock().expect("places").remove(&id);
        drop(removed);
    }

    /// The epoch of the Redis data this client's leases live in.
    pub(crate) fn epoch(&self) -> &Epoch {
        &self.shared.epoch
    }

    /// Learns the epoch a script told of `scope`; leases of an earlier epoch there are lost
    /// (`DataLost`).
    pub(crate) fn learn_epoch(&self, scope: u16, epoch: u64, longest_lease_ms: u64) {
        self.shared.learn_epoch(scope, epoch, longest_lease_ms);
    }

    pub(crate) fn unregister(&self, id: u64) {
        let removed = self.shared.leases.lock().expect("leases").remove(id);
        // Dropped outside the table's mutex: the registration may hold the last references.
        drop(removed);
    }

    /// Releases every lock still registered, fires their lost signals, and stops the actor.
    pub(crate) async fn shutdown(&self) {
        let (done, finished) = oneshot::channel();
        if self.shutdown.send(done).is_ok() {
            let _ = finished.await;
        }
    }
}

struct WatchdogActor {
    connections: Arc<Connections>,
    /// Where the wake channels are: releases at shutdown hand the lock to the next waiting
    /// instance.
    placement: Arc<Placement>,
    timing: WatchdogTiming,
    shared: Arc<WatchdogState>,
    shutdown: mpsc::UnboundedReceiver<oneshot::Sender<()>>,
}

impl WatchdogActor {
    async fn run(mut self) {
        let mut tick =
            tokio::time::interval_at(Instant::now() + self.timing.tick, self.timing.tick);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let next_deadline = {
                let mut leases = self.shared.leases.lock().expect("leases");
                let next = leases.deadlines.first().map(|(at, _)| *at);
                leases.planned_wake = next;
                next
            };
            tokio::select! {
                done = self.shutdown.recv() => {
                    self.release_all().await;
                    if let Some(done) = done {
                        let _ = done.send(());
                    }
                    break;
                }
                _ = tick.tick() => {
                    self.renew().await;
                    self.heartbeat().await;
                }
                _ = sleep_until(next_deadline.unwrap_or_else(Instant::now)),
                    if next_deadline.is_some() => self.expire(Instant::now()),
                () = self.shared.earlier_deadline.notified() => {}
            }
        }
    }

    async fn renew(&self) {
        let batch = self.due();
        if batch.is_empty() {
            // Nothing due, but locks are held: a look at the epoch alone (of each scope held)
            // tells their holders within a tick when Redis lost their data, before the
            // quarantine ends.
            let held = self.held_scopes();
            join_all(held.iter().map(|keys| self.check_epoch(keys))).await;
            return;
        }
        // One script per scope (a cluster runs a script in one slot only), all sent at once:
        // the cluster client pipelines those of one node.
        let mut by_scope: HashMap<u16, Vec<Due>> = HashMap::new();
        for due in batch {
            let scope = self.shared.epoch.scope_of(&due.1);
            by_scope.entry(scope).or_default().push(due);
        }
        join_all(
            by_scope
                .iter()
                .map(|(scope, due)| self.renew_scope(*scope, due)),
        )
        .await;
    }

    /// Renews the leases `due` of one scope, in chunks.
    async fn renew_scope(&self, scope: u16, due: &[Due]) {
        let lease_ms = self.timing.lease.as_millis() as u64;
        // A renewal that takes longer than the interval is no use; the deadline takes over.
        let limit = self
            .connections
            .command_timeout()
            .min(self.timing.renew_interval);
        for chunk in due.chunks(BATCH) {
            let pairs: Vec<(&LockKeys, &str)> = chunk
                .iter()
                .map(|(_, keys, owner)| (&**keys, &**owner))
                .collect();
            // Any shard will do: renewals need no order with other commands.
            let shard = chunk[0].1.hash();
            // A renewal that finds an epoch this client must learn first (one it has not seen,
            // or a longer lease granted in it) renewed nothing: it is sent again at once, so
            // learning costs no holder a tick of its lease. A changed epoch has told the
            // holders of the lost locks meanwhile, whom the second renewal no longer finds.
            for _ in 0..RENEWAL_ATTEMPTS {
                let sent_at = Instant::now();
                let epoch = self.shared.epoch.known(scope);
                let pairs = &pairs;
                let reply = self
                    .round_trip(shard, limit, "lease renewal", |mut conn| async move {
                        scripts::renew(&mut conn, pairs, lease_ms, &epoch).await
                    })
                    .await;
                match reply {
                    Some(RenewReply::EpochChanged {
                        epoch,
                        longest_lease_ms,
                    }) => self.shared.learn_epoch(scope, epoch, longest_lease_ms),
                    Some(RenewReply::Renewed(renewed)) => {
                        self.renewed(chunk, &renewed, sent_at);
                        break;
                    }
                    None => {
                        meter::renewals(Renewal::Failed, chunk.len());
                        break;
                    }
                }
            }
        }
    }

    /// The leases due for renewal: renewed at least `renew_interval` ago, i.e. less than
    /// `lease - renew_interval` left; the deadlines are ordered, so only those are visited.
    fn due(&self) -> Vec<Due> {
        let due = lost_deadline(Instant::now(), self.timing.lease) - self.timing.renew_interval;
        let leases = self.shared.leases.lock().expect("leases");
        leases
            .deadlines
            .iter()
            .take_while(|(at, _)| *at <= due)
            .filter_map(|(_, id)| leases.entries.get(id))
            .filter(|entry| entry.lease_mode == Lease::Watchdog)
            .map(|entry| (entry.id, entry.keys.clone(), entry.owner.clone()))
            .collect()
    }

    /// The keys of one lock this client holds in each scope it holds locks in.
    fn held_scopes(&self) -> Vec<Arc<LockKeys>> {
        let leases = self.shared.leases.lock().expect("leases");
        let mut scopes = HashMap::new();
        for entry in leases.entries.values() {
            let scope = self.shared.epoch.scope_of(&entry.keys);
            scopes.entry(scope).or_insert_with(|| entry.keys.clone());
        }
        scopes.into_values().collect()
    }

    /// Applies a renewal sent at `sent_at`: the leases still held get a new deadline, the
    /// others are told they were taken. Locks released meanwhile are no longer in the table
    /// and are skipped.
    fn renewed(&self, chunk: &[Due], renewed: &[bool], sent_at: Instant) {
        let taken: Vec<Registration> = {
            let mut leases = self.shared.leases.lock().expect("leases");
            chunk
                .iter()
                .zip(renewed)
                .filter_map(|((id, _, _), held)| {
                    if *held {
                        leases.extend(*id, lost_deadline(sent_at, self.timing.lease));
                        None
                    } else {
                        leases.remove(*id)
                    }
                })
                .collect()
        };
        meter::renewals(
            Renewal::Renewed,
            renewed.iter().filter(|held| **held).count(),
        );
        meter::renewals(Renewal::Taken, taken.len());
        for entry in taken {
            entry.lease_state.fire(entry.keys.hash(), LostReason::Taken);
        }
    }

    /// Extends the liveness of every place this client's waiters hold in a Redis queue. A
    /// failure is only logged: a place that runs out is dropped from its queue, and its
    /// waiter joins again at its next look.
    async fn heartbeat(&self) {
        let places: Vec<QueuedPlace> = {
            let places = self.shared.places.lock().expect("places");
            places
                .values()
                .map(|place| (place.keys.clone(), place.owner.clone()))
                .collect()
        };
        let alive_ms = self.timing.waiter_alive.as_millis() as u64;
        let limit = self.connections.command_timeout().min(self.timing.tick);
        // One script per scope, as for renewals (a cluster runs a script in one slot only),
        // all sent at once.
        let mut by_scope: HashMap<u16, Vec<QueuedPlace>> = HashMap::new();
        for place in places {
            let scope = self.shared.epoch.scope_of(&place.0);
            by_scope.entry(scope).or_default().push(place);
        }
        let chunks = by_scope.values().flat_map(|places| places.chunks(BATCH));
        join_all(chunks.map(|chunk| async move {
            let pairs: Vec<(&LockKeys, &str)> = chunk
                .iter()
                .map(|(keys, owner)| (&**keys, &**owner))
                .collect();
            let shard = chunk[0].0.hash();
            self.round_trip(shard, limit, "waiter heartbeat", |mut conn| async move {
                scripts::heartbeat(&mut conn, &pairs, alive_ms).await
            })
            .await;
        }))
        .await;
    }

    /// One script call on the connection of `key`'s shard, bounded by `limit`, while the
    /// deadlines that pass meanwhile still fire (a renewal stuck on an unreachable Redis must
    /// not delay telling a holder its lease is lost). A failure is noted against the
    /// connection and logged as `what`: `None`.
    async fn round_trip<T, F>(
        &self,
        key: &str,
        limit: Duration,
        what: &str,
        script: impl FnOnce(Conn) -> F,
    ) -> Option<T>
    where
        F: Future<Output = redis::RedisResult<T>>,
    {
        let outcome = self
            .firing_deadlines(timeout(limit, async {
                let conn = self.connections.get(key).await?;
                self.connections.note_sent();
                // A failed checkout was counted by `get`; a failed command is counted here.
                script(conn).await.map_err(|err| {
                    let err = self.connections.error_of(err);
                    meter::redis_error(err.kind());
                    err
                })
            }))
            .await
            .unwrap_or_else(|_| {
                meter::redis_error(ErrorKind::RedisUnavailable);
                Err(LockError::command_timeout())
            });
        match outcome {
            Ok(value) => Some(value),
            Err(err) => {
                self.connections.note_failure(key, &err);
                tracing::warn!(error = %err, "{what} failed");
                None
            }
        }
    }

    /// Awaits `work` while still firing the deadlines that pass meanwhile.
    async fn firing_deadlines<T>(&self, work: impl Future<Output = T>) -> T {
        let mut work = std::pin::pin!(work);
        loop {
            let next_deadline = {
                let leases = self.shared.leases.lock().expect("leases");
                leases.deadlines.first().map(|(at, _)| *at)
            };
            tokio::select! {
                outcome = &mut work => return outcome,
                _ = sleep_until(next_deadline.unwrap_or_else(Instant::now)),
                    if next_deadline.is_some() => self.expire(Instant::now()),
                () = self.shared.earlier_deadline.notified() => {}
            }
        }
    }

    /// Checks the epoch alone of the scope of `keys`, on the connection of its shard.
    async fn check_epoch(&self, keys: &LockKeys) {
        let limit = self
            .connections
            .command_timeout()
            .min(self.timing.renew_interval);
        let scope = self.shared.epoch.scope_of(keys);
        let epoch = self.shared.epoch.known(scope);
        let reply = self
            .round_trip(keys.hash(), limit, "epoch check", |mut conn| async move {
                scripts::renew(&mut conn, &[], 0, &epoch).await
            })
            .await;
        if let Some(RenewReply::EpochChanged {
            epoch,
            longest_lease_ms,
        }) = reply
        {
            self.shared.learn_epoch(scope, epoch, longest_lease_ms);
        }
    }

    fn expire(&self, now: Instant) {
        let expired = self.shared.leases.lock().expect("leases").take_expired(now);
        for entry in expired {
            let reason = if entry.lease_mode == Lease::Watchdog {
                LostReason::Unreachable
            } else {
                LostReason::Expired
            };
            entry.lease_state.fire(entry.keys.hash(), reason);
        }
    }

    async fn release_all(&mut self) {
        let entries: Vec<Registration> = {
            let mut leases = self.shared.leases.lock().expect("leases");
            leases.stopped = true;
            leases.deadlines.clear();
            leases.entries.drain().map(|(_, entry)| entry).collect()
        };
        let connections = &self.connections;
        let placement = &self.placement;
        join_all(entries.iter().map(|entry| async move {
            let scope_keys = placement.of(&entry.keys);
            let released = connections
                .run(entry.keys.hash(), |mut conn| async move {
                    scripts::release(
                        &mut conn,
                        &entry.keys,
                        entry.kind,
                        scope_keys,
                        &entry.owner,
                        ReleaseScope::All,
                    )
                    .await
                })
                .await;
            if let Err(err) = released {
                tracing::warn!(lock = %display_name(entry.keys.hash()), error = %err, "release at shutdown failed");
            }
            entry.lease_state.fire(entry.keys.hash(), LostReason::ShutDown);
        }))
        .await;
    }
}
