//! The notification actor: ONE pub/sub connection per client, subscribed to ONE channel, this
//! instance's wake channel, whatever the number of locks it waits for.
//!
//! A release that hands a lock to a waiter of this instance publishes
//! `<owner id> <fencing token> <server ms> <lease ms>` there, so only that instance hears of it, and the
//! actor passes it to that waiter only. A waiter registers its owner id in a shared table (no
//! await, no round trip) before it joins a queue in Redis, so no grant can arrive unheard.
//! After a lost connection the actor reconnects with backoff and wakes every waiter: grants
//! may have been missed meanwhile, and the next look at the lock finds them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{Instant, sleep_until, timeout};

/// First reconnect delay after the connection is lost; doubles on each failure.
const MIN_BACKOFF: Duration = Duration::from_millis(50);
/// Longest delay between reconnect attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// How often an idle connection is checked with PING, so a silently dead one is noticed.
const PING_INTERVAL: Duration = Duration::from_secs(5);

/// A lock handed to a waiter by a release, as announced on the wake channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grant {
    /// The first fencing token of the block reserved for the waiter.
    pub(crate) token: u64,
    /// The server's clock when the lock was handed over.
    pub(crate) server_ms: u64,
    /// The lease it was handed over with (the waiter's watchdog extends it).
    pub(crate) lease_ms: u64,
}

/// What a waiter sees of its slot.
#[derive(Debug, Clone, Copy, Default)]
struct Wake {
    /// Bumped on every (re)subscription and on shutdown: look at the lock again.
    wakeups: u64,
    grant: Option<Grant>,
}

type Slots = Arc<Mutex<HashMap<Arc<str>, watch::Sender<Wake>>>>;

fn wake_all(slots: &Slots) {
    for slot in slots.lock().expect("wake slots").values() {
        slot.send_modify(|wake| wake.wakeups += 1);
    }
}

/// Handle on the notification actor. Cheap to clone; the actor ends with the last handle.
#[derive(Debug, Clone)]
pub(crate) struct PubSub {
    slots: Slots,
    shutdown: mpsc::UnboundedSender<oneshot::Sender<()>>,
}

/// One waiting owner's slot; dropping it forgets the owner.
#[derive(Debug)]
pub(crate) struct WakeSlot {
    slots: Slots,
    owner: Arc<str>,
    wake: watch::Receiver<Wake>,
    /// The grant already returned: it is returned once, so a waiter that found it stale and
    /// looked again is never handed it a second time.
    delivered: Option<Grant>,
}

impl PubSub {
    /// Spawns the actor on the current runtime, listening on `channel`. It connects in the
    /// background, so a Redis that is down at start only delays wake-ups (waiters poll
    /// meanwhile).
    pub(crate) fn start(client: redis::Client, channel: String, command_timeout: Duration) -> Self {
        let (shutdown, receiver) = mpsc::unbounded_channel();
        let slots = Slots::default();
        let actor = Actor {
            client,
            channel,
            command_timeout,
            slots: slots.clone(),
            shutdown: receiver,
            connection: None,
            backoff: MIN_BACKOFF,
            reconnect_at: Instant::now(),
        };
        tokio::spawn(actor.run());
        Self { slots, shutdown }
    }

    /// Registers `owner`, so a grant to it reaches the returned slot.
    pub(crate) fn register(&self, owner: Arc<str>) -> WakeSlot {
        let (sender, wake) = watch::channel(Wake::default());
        self.slots
            .lock()
            .expect("wake slots")
            .insert(owner.clone(), sender);
        WakeSlot {
            slots: self.slots.clone(),
            owner,
            wake,
            delivered: None,
        }
    }

    /// Stops the actor and wakes every waiter.
    pub(crate) async fn shutdown(&self) {
        let (done, finished) = oneshot::channel();
        if self.shutdown.send(done).is_ok() {
            let _ = finished.await;
        }
    }

    /// How many owners of this client wait in a Redis queue right now.
    pub(crate) fn waiting(&self) -> usize {
        self.slots.lock().expect("wake slots").len()
    }
}

impl WakeSlot {
    /// Marks every wake-up so far as seen; call before each look at the lock.
    pub(crate) fn mark_seen(&mut self) {
        self.wake.borrow_and_update();
    }

    /// Sleeps until the lock is granted to this owner (a grant not returned before), or a
    /// wake-up not yet seen, or `bound` (`None`).
    pub(crate) async fn wait(&mut self, bound: Duration) -> Option<Grant> {
        let pending = self.wake.borrow().grant;
        if let Some(grant) = self.fresh(pending) {
            return Some(grant);
        }
        let deadline = Instant::now() + bound;
        match timeout(bound, self.wake.changed()).await {
            Ok(Ok(())) => {
                let granted = self.wake.borrow_and_update().grant;
                self.fresh(granted)
            }
            Ok(Err(_)) => {
                // The sender is gone (only if the table was torn down): poll instead.
                sleep_until(deadline).await;
                None
            }
            Err(_) => None,
        }
    }

    /// `grant`, unless it was returned before.
    fn fresh(&mut self, grant: Option<Grant>) -> Option<Grant> {
        if grant.is_none() || grant == self.delivered {
            return None;
        }
        self.delivered = grant;
        grant
    }
}

impl Drop for WakeSlot {
    fn drop(&mut self) {
        self.slots.lock().expect("wake slots").remove(&self.owner);
    }
}

struct Actor {
    client: redis::Client,
    channel: String,
    command_timeout: Duration,
    slots: Slots,
    shutdown: mpsc::UnboundedReceiver<oneshot::Sender<()>>,
    connection: Option<(PubSubSink, PubSubStream)>,
    backoff: Duration,
    reconnect_at: Instant,
}

enum Event {
    Shutdown(Option<oneshot::Sender<()>>),
    Message(Option<redis::Msg>),
    Reconnect,
    Ping,
}

impl Actor {
    async fn run(mut self) {
        let mut ping = tokio::time::interval_at(Instant::now() + PING_INTERVAL, PING_INTERVAL);
        loop {
            let connected = self.connection.is_some();
            let event = {
                let stream = self.connection.as_mut().map(|(_, stream)| stream);
                tokio::select! {
                    done = self.shutdown.recv() => Event::Shutdown(done),
                    message = async {
                        match stream {
                            Some(stream) => stream.next().await,
                            None => std::future::pending().await,
                        }
                    } => Event::Message(message),
                    _ = sleep_until(self.reconnect_at), if !connected => Event::Reconnect,
                    _ = ping.tick(), if connected => Event::Ping,
                }
            };
            match event {
                Event::Shutdown(done) => {
                    wake_all(&self.slots);
                    if let Some(done) = done {
                        let _ = done.send(());
                    }
                    break;
                }
                Event::Message(Some(message)) => self.deliver(&message),
                Event::Message(None) => self.disconnect("the pub/sub connection closed"),
                Event::Reconnect => self.connect().await,
                Event::Ping => self.ping().await,
            }
        }
    }

    /// Passes a grant to the waiter it names; grants to owners that stopped waiting are
    /// ignored, because their undo releases them.
    fn deliver(&self, message: &redis::Msg) {
        let Some((owner, grant)) = parse_grant(message.get_payload_bytes()) else {
            tracing::warn!(
                channel = message.get_channel_name(),
                "unreadable wake message"
            );
            return;
        };
        if let Some(slot) = self.slots.lock().expect("wake slots").get(owner) {
            slot.send_modify(|wake| wake.grant = Some(grant));
        }
    }

    async fn connect(&mut self) {
        let connected = timeout(self.command_timeout, async {
            let (mut sink, stream) = self.client.get_async_pubsub().await?.split();
            sink.subscribe(&self.channel).await?;
            Ok::<_, redis::RedisError>((sink, stream))
        })
        .await;
        match connected {
            Ok(Ok(connection)) => {
                tracing::debug!(channel = %self.channel, "listening for wake-ups");
                self.connection = Some(connection);
                self.backoff = MIN_BACKOFF;
                // Grants made while nobody listened are found by the waiters' next look.
                wake_all(&self.slots);
            }
            Ok(Err(err)) => self.retry_later(&err.to_string()),
            Err(_) => self.retry_later("connecting timed out"),
        }
    }

    async fn ping(&mut self) {
        let Some((sink, _)) = self.connection.as_mut() else {
            return;
        };
        match timeout(self.command_timeout, sink.ping::<redis::Value>()).await {
            Ok(Ok(_)) => {}
            Ok(Err(err)) => self.disconnect(&err.to_string()),
            Err(_) => self.disconnect("PING timed out"),
        }
    }

    fn retry_later(&mut self, reason: &str) {
        tracing::warn!(
            reason,
            retry_in_ms = self.backoff.as_millis() as u64,
            "pub/sub connection failed"
        );
        self.reconnect_at = Instant::now() + self.backoff;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
    }

    fn disconnect(&mut self, reason: &str) {
        self.connection = None;
        // Waiters look at their locks again at once and poll until the connection is back.
        wake_all(&self.slots);
        self.retry_later(reason);
    }
}

/// Reads `<owner id> <token> <server ms> <lease ms>`.
fn parse_grant(payload: &[u8]) -> Option<(&str, Grant)> {
    let text = std::str::from_utf8(payload).ok()?;
    let mut parts = text.split(' ');
    let owner = parts.next()?;
    let token = parts.next()?.parse().ok()?;
    let server_ms = parts.next()?.parse().ok()?;
    let lease_ms = parts.next()?.parse().ok()?;
    Some((
        owner,
        Grant {
            token,
            server_ms,
            lease_ms,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_are_read_from_the_wake_message() {
        let (owner, grant) = parse_grant(b"ab12:7 1763682600000001 1763682600000 2500").unwrap();
        assert_eq!(owner, "ab12:7");
        assert_eq!(
            grant,
            Grant {
                token: 1_763_682_600_000_001,
                server_ms: 1_763_682_600_000,
                lease_ms: 2500,
            }
        );
        assert!(parse_grant(b"ab12:7 x 1 1").is_none());
        assert!(parse_grant(b"ab12:7 1 1").is_none());
        assert!(parse_grant(b"ab12:7").is_none());
    }
}
