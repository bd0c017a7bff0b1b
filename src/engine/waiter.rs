//! An owner waiting for a lock in Redis: its place in the lock's queue, its wake slot, and
//! the undo that gives both back if the wait is abandoned.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::engine::call_queue::{Answer, LookOwner, QueuedLook, Turn};
use crate::engine::deadlines::lost_deadline;
use crate::engine::gathered::{AloneCall, QueuedAnswer, look_queues, send_looks};
use crate::engine::giveback::{GiveBack, spawn_give_back};
use crate::engine::shared::ClientState;
use crate::engine::wake::{Grant, Listening, WakeSlot};
use crate::error::{ErrorKind, LockError, Result};
use crate::keys::LockKeys;
use crate::lock_kind::LockKind;
use crate::wire::conn::Conn;
use crate::wire::scripts::{
    self, AcquireMode, AcquireReply, AcquireTerms, ReleaseScope, RenewReply,
};

/// New epochs one attempt learns before it gives up (a Redis losing its data in a loop).
const MAX_EPOCHS_LEARNED: u32 = 3;
/// First pause before a queued owner looks again after Redis was unavailable; doubles on
/// each failure.
const FIRST_RIDE_OUT_PAUSE: Duration = Duration::from_millis(50);
/// Longest pause between those looks.
const LONGEST_RIDE_OUT_PAUSE: Duration = Duration::from_secs(1);

/// How a queued owner rides out Redis being unavailable: during a failover the old master
/// pauses writes and then answers MOVED, and the cluster client takes a while to follow, so
/// a look may time out or fail although Redis keeps the lock, the queue and this owner's
/// place. Giving up then would end a wait that nothing ended. It looks again, with growing
/// pauses, for as long as `bound` from the first failure (the watchdog lease: what this
/// client's holders ride out); a zero bound gives every failure back at once.
#[derive(Debug)]
struct RideOut {
    bound: Duration,
    /// When the outage stops being ridden out, once it started.
    until: Option<Instant>,
    pause: Duration,
}

impl RideOut {
    fn new(bound: Duration) -> Self {
        Self {
            bound,
            until: None,
            pause: FIRST_RIDE_OUT_PAUSE,
        }
    }

    /// Sleeps before the next try after `err`, or gives `err` back: it is not Redis being
    /// unavailable (nothing a retry cures), or the outage outlasted the bound.
    async fn pause_after(&mut self, err: LockError) -> Result<()> {
        if err.kind() != ErrorKind::RedisUnavailable || self.bound.is_zero() {
            return Err(err);
        }
        let now = Instant::now();
        let until = *self.until.get_or_insert(now + self.bound);
        let left = until.saturating_duration_since(now);
        if left.is_zero() {
            return Err(err);
        }
        let pause = self.pause.min(left);
        self.pause = (self.pause * 2).min(LONGEST_RIDE_OUT_PAUSE);
        tracing::debug!(
            error = %err,
            retry_in_ms = pause.as_millis() as u64,
            "redis unavailable while queued: looking again"
        );
        tokio::time::sleep(pause).await;
        Ok(())
    }
}

/// What Redis may keep of a waiting owner, for its waiter to give back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kept {
    /// Nothing, and no script has seen the owner yet: a wait joins the queue as a newcomer
    /// (`join`), whose look need not ask what only an owner seen before can have (a grant),
    /// and no grant to it can come before that look.
    Unseen,
    /// Nothing: the last reply left nothing of it (a look again asks), or it holds the lock
    /// now (its holder answers for it).
    Nothing,
    /// Maybe a place in the queue, or a grant nobody saw: the undo gives them back.
    PlaceOrGrant,
}

/// How one attempt reaches Redis: its connection, and how it gets a fresh one when a send
/// fails.
struct Route {
    conn: Conn,
    ride_out: RideOut,
    reconnect: Reconnect,
}

/// Whether an attempt may still send again at once on a fresh connection, after one broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reconnect {
    Available,
    /// Used once: a connection that breaks again is an outage, ridden out or given back.
    Used,
}

/// The last look that found the lock held (or the release that queued this owner): a grant
/// heard of later is checked and dated against it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LastLook {
    /// When it was sent.
    pub(crate) sent_at: Instant,
    /// The server's clock when it ran.
    pub(crate) server_ms: u64,
    /// The last fencing token reserved in the lock's scope when it ran: every grant after
    /// it reserves tokens above this one, whatever the server's clock did. 0 after the first
    /// look of an owner Redis has never seen (`join`), which queues it: no grant to it can
    /// come before that look.
    pub(crate) last_token: u64,
}

/// One owner's wait. Dropping it before the lock is held (cancelled, failed, shut down)
/// leaves the queue, and releases the lock if Redis granted it unseen.
#[derive(Debug)]
pub(crate) struct Waiter {
    shared: Arc<ClientState>,
    keys: Arc<LockKeys>,
    kind: LockKind,
    owner: Arc<str>,
    slot: WakeSlot,
    /// The last look that found the lock held: a later grant is checked and dated against it.
    last_look: Option<LastLook>,
    /// The connection of the last attempt: the undo goes out after it on the same one.
    conn: Option<Conn>,
    /// What Redis may keep of this owner, which dropping the waiter gives back.
    kept: Kept,
    /// How long the undo keeps trying: a grant nobody saw runs out after its lease anyway.
    undo_within: Duration,
    /// The watchdog's heartbeat for this owner's place in the queue, once it has one.
    place: Option<u64>,
    /// On a cluster, this waiter's share of its slot's subscription, once it queued.
    listening: Option<Box<dyn Listening>>,
}

/// A place a release took in the queue for the next task of its client.
pub(crate) struct QueuedPlace {
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) owner: Arc<str>,
    pub(crate) slot: WakeSlot,
    /// The release that queued it, as a look.
    pub(crate) queued_by: LastLook,
    /// How long what the place holds in Redis could keep the lock from others: the lease.
    pub(crate) undo_within: Duration,
}

impl Waiter {
    /// A fresh owner, registered for wake-ups before it ever reaches Redis.
    pub(crate) fn new(shared: &Arc<ClientState>, keys: Arc<LockKeys>, kind: LockKind) -> Self {
        let owner = shared.new_owner();
        let slot = shared.pubsub.register(owner.clone());
        Self {
            shared: shared.clone(),
            keys,
            kind,
            owner,
            slot,
            last_look: None,
            conn: None,
            kept: Kept::Unseen,
            undo_within: Duration::ZERO,
            place: None,
            listening: None,
        }
    }

    /// The waiter of a place a release already took in the queue.
    pub(crate) fn queued(shared: &Arc<ClientState>, place: QueuedPlace) -> Self {
        let mut queued = Self {
            shared: shared.clone(),
            keys: place.keys,
            // Only an exclusive lock's release queues the next task of its client.
            kind: LockKind::Exclusive,
            owner: place.owner,
            slot: place.slot,
            last_look: Some(place.queued_by),
            conn: None,
            kept: Kept::PlaceOrGrant,
            undo_within: place.undo_within,
            place: None,
            listening: None,
        };
        queued.keep_place();
        queued
    }

    /// Has the watchdog keep this owner's place in the queue alive while it waits.
    fn keep_place(&mut self) {
        if self.place.is_none() {
            let id = self.shared.new_holder_id();
            self.shared
                .watchdog
                .keep_place(id, self.keys.clone(), self.owner.clone());
            self.place = Some(id);
        }
    }

    /// On a cluster, makes sure this waiter's slot channel is subscribed before it sleeps in
    /// the queue. Returns `true` when it subscribed just now: a grant may have been published
    /// before, unheard, so the lock must be looked at again. A lock taken at once never
    /// subscribes; on one server this does nothing.
    pub(crate) async fn start_listening(&mut self) -> bool {
        if self.listening.is_some() {
            return false;
        }
        let shared = &self.shared;
        let Some(listening) = shared.pubsub.listen(shared.placement.scope_of(&self.keys)) else {
            return false;
        };
        // Bounded: a subscription that fails leaves this waiter to its re-poll bound.
        let _ = tokio::time::timeout(shared.config.command_timeout, listening.ready()).await;
        self.listening = Some(listening);
        true
    }

    /// A grant to this waiter went unheard: on a cluster, its slot's channel is subscribed
    /// again (the server confirms a subscription it still has, and restores a lost one).
    pub(crate) fn resubscribe(&self) {
        let shared = &self.shared;
        shared
            .pubsub
            .resubscribe(shared.placement.scope_of(&self.keys));
    }

    /// Whether this owner already has a place in the queue.
    pub(crate) fn is_queued(&self) -> bool {
        self.last_look.is_some()
    }

    /// One run of the acquire script for this owner: takes the lock, or (in `Wait` mode)
    /// joins or refreshes its place in the queue.
    pub(crate) async fn attempt(
        &mut self,
        terms: &AcquireTerms,
        mode: AcquireMode,
    ) -> Result<AcquireReply> {
        self.slot.mark_seen();
        // An owner already queued rides out an outage as this client's holders do; a first
        // look (or a try) fails fast.
        let mut ride_out = RideOut::new(if mode == AcquireMode::Wait && self.is_queued() {
            self.shared.config.watchdog_lease
        } else {
            Duration::ZERO
        });
        let conn = self.connection(&mut ride_out).await?;
        let route = Route {
            conn,
            ride_out,
            reconnect: Reconnect::Available,
        };
        self.undo_within = Duration::from_millis(terms.lease_ms);
        let answer = self.answer(terms, mode, route).await?;
        self.record(terms, mode, &answer);
        Ok(answer.reply)
    }

    /// Sends the acquire script in `mode` until Redis answers more than a new epoch to
    /// learn, on a fresh connection of `route` after a failed send.
    async fn answer(
        &mut self,
        terms: &AcquireTerms,
        mode: AcquireMode,
        mut route: Route,
    ) -> Result<Answer> {
        let shared = Arc::clone(&self.shared);
        // Until its first script is sent, Redis cannot know this owner: a wait joins the
        // queue as a newcomer. Once sent, Redis may keep a place or a grant of it. On a
        // cluster the first script itself may run twice (redis-rs sends it again after a
        // dropped connection), and its second run must find the lock its first took.
        let newcomer = !shared.placement.may_send_again();
        let mut send_mode = match (mode, self.kept) {
            (AcquireMode::Wait, Kept::Unseen) if newcomer => AcquireMode::Join,
            (mode, _) => mode,
        };
        // With group commit, a first look at an exclusive or fair lock on one server may go
        // out with others.
        let mut first_look = shared.config.group_commit
            && newcomer
            && self.kept == Kept::Unseen
            && matches!(self.kind, LockKind::Exclusive | LockKind::Fair)
            && matches!(send_mode, AcquireMode::Join | AcquireMode::Try);
        let mut epochs_learned = 0;
        loop {
            let sent = if std::mem::take(&mut first_look) {
                self.send_first_look(&mut route.conn, terms, send_mode)
                    .await
            } else {
                self.kept = Kept::PlaceOrGrant;
                self.send(&mut route.conn, terms, send_mode).await
            };
            self.kept = Kept::PlaceOrGrant;
            send_mode = mode;
            let answer = match sent {
                Ok(answer) => answer,
                Err(err) => {
                    self.recover(&mut route, err).await?;
                    continue;
                }
            };
            match answer.reply {
                // Nothing was done: learn the epoch (telling this client's holders when
                // Redis lost their locks) and look again.
                AcquireReply::EpochChanged {
                    epoch,
                    longest_lease_ms,
                } if epochs_learned < MAX_EPOCHS_LEARNED => {
                    shared.watchdog.learn_epoch(
                        shared.placement.scope_of(&self.keys),
                        epoch,
                        longest_lease_ms,
                    );
                    epochs_learned += 1;
                }
                AcquireReply::Quarantined { left_ms, .. } => {
                    shared
                        .watchdog
                        .epoch()
                        .note_quarantine(Duration::from_millis(left_ms));
                    return Ok(answer);
                }
                AcquireReply::EpochChanged { .. } => {
                    self.kept = Kept::Nothing;
                    return Err(LockError::new(
                        ErrorKind::RedisUnavailable,
                        "the server's epoch keeps changing: Redis keeps losing its data",
                    ));
                }
                _ => return Ok(answer),
            }
        }
    }

    /// Sends the first look of this owner, in `mode`: alone and at once when nothing of its
    /// connection is in flight, or else with the first looks that come meanwhile, when the
    /// call in flight ends (see `gathered.rs`). Redis may keep something of the owner once the
    /// look is sent alone; a queued look abandoned before its answer is read is given back by
    /// whoever sees the answer.
    async fn send_first_look(
        &mut self,
        conn: &mut Conn,
        terms: &AcquireTerms,
        mode: AcquireMode,
    ) -> Result<Answer> {
        let shared = Arc::clone(&self.shared);
        let shard = shared.connections.shard_of(self.keys.hash());
        let of = LookOwner {
            keys: self.keys.clone(),
            owner: self.owner.clone(),
            kind: self.kind,
            mode,
            undo_within: self.undo_within,
        };
        let queue = |answer| QueuedLook {
            of: of.clone(),
            terms: *terms,
            answer,
        };
        match shared.look_queues.enter(shard, queue) {
            Turn::Alone => {
                let _in_flight = AloneCall::new(&shared, shard, look_queues, send_looks);
                self.kept = Kept::PlaceOrGrant;
                self.send(conn, terms, mode).await
            }
            Turn::Queued(receiver) => QueuedAnswer::new(&shared, receiver, of, conn.clone()).await,
        }
    }

    /// Sends the acquire script once, in `mode`, on `conn`.
    async fn send(
        &self,
        conn: &mut Conn,
        terms: &AcquireTerms,
        mode: AcquireMode,
    ) -> Result<Answer> {
        let shared = &self.shared;
        let sent_at = Instant::now();
        let epoch = shared.watchdog.epoch().known_for(&self.keys);
        // A grant of a lease longer than the client knew of is recorded with the reply.
        let asked_in = (terms.lease_ms > epoch.known_lease_ms).then_some(epoch.known);
        let reply = shared
            .connections
            .bounded(
                self.keys.hash(),
                scripts::acquire(
                    conn,
                    &self.keys,
                    shared.scope_keys(&self.keys),
                    &self.owner,
                    terms,
                    mode,
                    &epoch,
                ),
            )
            .await?;
        Ok(Answer {
            sent_at,
            reply,
            asked_in,
        })
    }

    /// After a send failed with `err`: a fresh connection on `route` to send again on, or
    /// `err` back when it is not worth another send.
    async fn recover(&mut self, route: &mut Route, err: LockError) -> Result<()> {
        if err.is_connection_broken() && route.reconnect == Reconnect::Available {
            // A connection that broke since the last command (a cut, a killed client):
            // once more on a fresh one. The script is safe to repeat for one owner, and
            // a Redis that is really gone fails the second time too.
            route.reconnect = Reconnect::Used;
        } else {
            // Redis unavailable for a while (a failover, a slot moving): a queued owner
            // looks again on a fresh connection until the outage outlasts its bound.
            route.ride_out.pause_after(err).await?;
            self.shared.ensure_running()?;
        }
        route.conn = self.connection(&mut route.ride_out).await?;
        Ok(())
    }

    /// Keeps what the `answer` to an attempt in `mode` says Redis keeps of this owner.
    fn record(&mut self, terms: &AcquireTerms, mode: AcquireMode, answer: &Answer) {
        let shared = &self.shared;
        match answer.reply {
            AcquireReply::Waiting {
                server_ms,
                last_token,
                ..
            } if mode == AcquireMode::Wait => {
                self.last_look = Some(LastLook {
                    sent_at: answer.sent_at,
                    server_ms,
                    last_token,
                });
                self.keep_place();
            }
            // Held elsewhere and not queued, or refused (a semaphore's refusal drops a place an
            // earlier look queued), or Redis lost its data (with whatever an earlier look
            // queued) and grants nothing yet: Redis keeps nothing of this owner.
            AcquireReply::Waiting { .. }
            | AcquireReply::NotOwner
            | AcquireReply::PermitsMismatch { .. }
            | AcquireReply::Quarantined { .. } => self.kept = Kept::Nothing,
            AcquireReply::Acquired { .. } => {
                if let Some(epoch) = answer.asked_in {
                    shared.watchdog.epoch().granted(
                        shared.placement.scope_of(&self.keys),
                        epoch,
                        terms.lease_ms,
                    );
                }
            }
            AcquireReply::EpochChanged { .. } => {}
        }
    }

    /// The connection of this owner's key (kept for the undo), checked out again for as long
    /// as `ride_out` rides out the failures.
    async fn connection(&mut self, ride_out: &mut RideOut) -> Result<Conn> {
        loop {
            match self.shared.connections.get(self.keys.hash()).await {
                Ok(conn) => {
                    self.conn = Some(conn.clone());
                    return Ok(conn);
                }
                Err(err) => {
                    ride_out.pause_after(err).await?;
                    self.shared.ensure_running()?;
                }
            }
        }
    }

    /// Sleeps until a grant to this owner, a wake-up, or `bound`.
    pub(crate) async fn wait(&mut self, bound: Duration) -> Option<Grant> {
        self.slot.wait(bound).await
    }

    /// When the holder of a granted lock must be told it is lost unless renewed, or `None`
    /// when the grant cannot be vouched for and the lock must be looked at again: a grant
    /// older than the last look (it lapsed unheard, and this owner queued again), or one
    /// already past that deadline (this task or its runtime stalled).
    ///
    /// A grant after the look has a token above the last one the look read: the server's
    /// clock alone cannot tell (stepped back in between, it dates an older grant after the
    /// look). A grant the server's clock dates before the look is looked at again too, which
    /// covers a look that read no token counter (one evicted, say). A grant after the look is
    /// dated from when the look was sent plus the server time between the two: that never
    /// overstates the lease but by a forward step of the server's clock, which shortens every
    /// lease in Redis as much (see the safety chapter).
    pub(crate) fn grant_deadline(&self, grant: Grant) -> Option<Instant> {
        let look = self.last_look?;
        if grant.token <= look.last_token {
            return None;
        }
        let since_look = grant.server_ms.checked_sub(look.server_ms)?;
        let granted = look.sent_at + Duration::from_millis(since_look);
        let deadline = lost_deadline(granted, Duration::from_millis(grant.lease_ms));
        (Instant::now() < deadline).then_some(deadline)
    }

    /// Extends the lease of the lock this owner was granted to `lease_ms`: a fixed lease
    /// found by a look has less left than asked, and is never renewed.
    /// Returns when the extension was sent, or `None` when the lock is no longer this
    /// owner's (the grant lapsed) or Redis lost its data meanwhile: look again.
    pub(crate) async fn extend_to(&mut self, lease_ms: u64) -> Result<Option<Instant>> {
        let shared = &self.shared;
        let mut conn = shared.connections.get(self.keys.hash()).await?;
        self.conn = Some(conn.clone());
        let sent_at = Instant::now();
        let epoch = shared.watchdog.epoch().known_for(&self.keys);
        let locks = [(&*self.keys, &*self.owner)];
        let reply = shared
            .connections
            .bounded(
                self.keys.hash(),
                scripts::renew(&mut conn, &locks, lease_ms, &epoch),
            )
            .await?;
        Ok(match reply {
            RenewReply::Renewed(renewed) if renewed.first() == Some(&true) => Some(sent_at),
            RenewReply::Renewed(_) => None,
            RenewReply::EpochChanged {
                epoch,
                longest_lease_ms,
            } => {
                shared.watchdog.learn_epoch(
                    shared.placement.scope_of(&self.keys),
                    epoch,
                    longest_lease_ms,
                );
                None
            }
        })
    }

    /// The lock is held by this owner: nothing to undo. Returns the owner id.
    pub(crate) fn take_owner(&mut self) -> Arc<str> {
        self.kept = Kept::Nothing;
        self.owner.clone()
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if let Some(place) = self.place.take() {
            self.shared.watchdog.forget_place(place);
        }
        if self.kept == Kept::PlaceOrGrant {
            let give_back = GiveBack {
                keys: self.keys.clone(),
                kind: self.kind,
                owner: self.owner.clone(),
                scope: ReleaseScope::All,
                conn: self.conn.take(),
                within: self.undo_within,
            };
            spawn_give_back(self.shared.clone(), give_back);
        }
    }
}
