//! An owner waiting for a lock in Redis: its place in the lock's queue, its wake slot, and
//! the undo that gives both back if the wait is abandoned.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

use crate::client::Inner;
use crate::error::Result;
use crate::keys::LockKeys;
use crate::pubsub::{Grant, WakeSlot};
use crate::scripts::{self, AcquireMode, AcquireReply, ReleaseScope, Terms};

/// One owner's wait. Dropping it before the lock is held (cancelled, failed, shut down)
/// leaves the queue, and releases the lock if Redis granted it unseen.
#[derive(Debug)]
pub(crate) struct QueuedWait {
    inner: Arc<Inner>,
    keys: Arc<LockKeys>,
    owner: Arc<str>,
    slot: WakeSlot,
    /// When the last look that found the lock held was sent, and the server's clock when it
    /// ran: a later grant is dated against these.
    last_look: Option<(Instant, u64)>,
    /// The connection of the last attempt: the undo goes out after it on the same one.
    conn: Option<MultiplexedConnection>,
    /// Redis may know this owner (queued, or granted).
    armed: bool,
}

impl QueuedWait {
    /// A fresh owner, registered for wake-ups before it ever reaches Redis.
    pub(crate) fn new(inner: &Arc<Inner>, keys: Arc<LockKeys>) -> Self {
        let owner = inner.new_owner();
        let slot = inner.pubsub.register(owner.clone());
        Self {
            inner: inner.clone(),
            keys,
            owner,
            slot,
            last_look: None,
            conn: None,
            armed: false,
        }
    }

    /// An owner a release already queued (sent at `sent_at`, run at `server_ms`).
    pub(crate) fn queued(
        inner: &Arc<Inner>,
        keys: Arc<LockKeys>,
        owner: Arc<str>,
        slot: WakeSlot,
        sent_at: Instant,
        server_ms: u64,
    ) -> Self {
        Self {
            inner: inner.clone(),
            keys,
            owner,
            slot,
            last_look: Some((sent_at, server_ms)),
            conn: None,
            armed: true,
        }
    }

    /// Whether this owner already has a place in the queue.
    pub(crate) fn is_queued(&self) -> bool {
        self.last_look.is_some()
    }

    /// One run of the acquire script for this owner: takes the lock, or (in `Wait` mode)
    /// joins or refreshes its place in the queue.
    pub(crate) async fn attempt(
        &mut self,
        terms: &Terms,
        mode: AcquireMode,
    ) -> Result<AcquireReply> {
        let inner = &self.inner;
        self.slot.mark_seen();
        let mut conn = inner.connections.get(self.keys.hash()).await?;
        self.conn = Some(conn.clone());
        self.armed = true;
        let sent_at = Instant::now();
        let reply = inner
            .connections
            .bounded(
                self.keys.hash(),
                scripts::acquire(
                    &mut conn,
                    &self.keys,
                    &inner.wake_prefix,
                    &self.owner,
                    terms,
                    mode,
                ),
            )
            .await?;
        match reply {
            AcquireReply::Waiting { server_ms, .. } if mode == AcquireMode::Wait => {
                self.last_look = Some((sent_at, server_ms));
            }
            // Held elsewhere and not queued, or refused: Redis keeps nothing of this owner.
            AcquireReply::Waiting { .. } | AcquireReply::NotOwner => self.armed = false,
            AcquireReply::Acquired { .. } => {}
        }
        Ok(reply)
    }

    /// Sleeps until a grant to this owner, a wake-up, or `bound`.
    pub(crate) async fn wait(&mut self, bound: Duration) -> Option<Grant> {
        self.slot.wait(bound).await
    }

    /// The local moment by which a lock granted with a lease of `lease_ms` may run out: the
    /// grant came after the last look ran, so dating it from when that look was sent never
    /// overstates the lease.
    pub(crate) fn grant_deadline(&self, grant: Grant, lease_ms: u64) -> Instant {
        let (sent_at, server_ms) = self.last_look.unwrap_or((Instant::now(), grant.server_ms));
        sent_at + Duration::from_millis(grant.server_ms.saturating_sub(server_ms) + lease_ms)
    }

    /// The lock is held by this owner: nothing to undo. Returns the owner id.
    pub(crate) fn settle(mut self) -> Arc<str> {
        self.armed = false;
        self.owner.clone()
    }
}

impl Drop for QueuedWait {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let inner = self.inner.clone();
        let keys = self.keys.clone();
        let owner = self.owner.clone();
        let conn = self.conn.take();
        inner.runtime.clone().spawn(async move {
            let undone = tokio::time::timeout(inner.connections.command_timeout(), async {
                let mut conn = match conn {
                    Some(conn) => conn,
                    None => inner.connections.get(keys.hash()).await?,
                };
                inner.connections.note_sent();
                let released = scripts::release(
                    &mut conn,
                    &keys,
                    &inner.wake_prefix,
                    &owner,
                    ReleaseScope::All,
                )
                .await?;
                Ok::<_, crate::LockError>(released)
            })
            .await;
            tracing::debug!(
                lock = keys.hash(),
                ?undone,
                "left the queue of an abandoned wait"
            );
        });
    }
}
