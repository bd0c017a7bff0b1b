//! The notification actor: ONE pub/sub connection per client, subscribed to ONE channel, this
//! instance's wake channel, whatever the number of locks it waits for (on a cluster, the
//! sharded actor of `sharded.rs` listens instead).
//!
//! A release that hands a lock to a waiter of this instance publishes the grant there (see
//! `wake.rs`), so only that instance hears of it, and the actor passes it to that waiter
//! only. After a lost connection the actor reconnects with backoff and wakes every waiter:
//! grants may have been missed meanwhile, and the next look at the lock finds them.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use redis::cluster::ClusterClientBuilder;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, sleep_until, timeout};

use crate::engine::sharded::{Sharded, WakeChannels};
use crate::engine::wake::{Listening, WakeSlot, WakeTable};
use crate::wire::sentinel::Dialer;

/// First reconnect delay after the connection is lost; doubles on each failure.
const MIN_BACKOFF: Duration = Duration::from_millis(50);
/// Longest delay between reconnect attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// How often an idle connection is checked with PING, so a silently dead one is noticed.
const PING_INTERVAL: Duration = Duration::from_secs(5);

/// Where wake-ups come from: the one server's pub/sub, or a cluster's sharded pub/sub.
pub(crate) enum WakeSource {
    /// A pub/sub connection to the server (or the master Sentinel names) this dials.
    Server(Dialer),
    /// The cluster client these settings build (the actor adds RESP3 and its push channel).
    Cluster(Box<ClusterClientBuilder>),
}

/// Handle on the notification actor. Cheap to clone; the actor ends with the last handle.
#[derive(Debug, Clone)]
pub(crate) struct PubSub {
    table: WakeTable,
    /// The cluster's listener, which waiters join per slot.
    sharded: Option<Sharded>,
    shutdown: mpsc::UnboundedSender<oneshot::Sender<()>>,
}

impl PubSub {
    /// Spawns the actor on the current runtime, listening on this instance's channel(s). It
    /// connects in the background, so a Redis that is down at start only delays wake-ups
    /// (waiters poll meanwhile).
    pub(crate) fn start(source: WakeSource, channels: WakeChannels) -> Self {
        let (shutdown, receiver) = mpsc::unbounded_channel();
        let table = WakeTable::default();
        let sharded = match source {
            WakeSource::Server(dialer) => {
                let prefix = &channels.placement.scope_keys(0).wake_prefix;
                let actor = PubSubActor {
                    dialer,
                    channel: format!("{prefix}{}", channels.instance_id),
                    command_timeout: channels.command_timeout,
                    table: table.clone(),
                    shutdown: receiver,
                    connection: None,
                    backoff: MIN_BACKOFF,
                    reconnect_at: Instant::now(),
                };
                tokio::spawn(actor.run());
                None
            }
            WakeSource::Cluster(builder) => {
                Some(Sharded::start(*builder, table.clone(), channels, receiver))
            }
        };
        Self {
            table,
            sharded,
            shutdown,
        }
    }

    /// Registers `owner`, so a grant to it reaches the returned slot.
    pub(crate) fn register(&self, owner: Arc<str>) -> WakeSlot {
        self.table.register(owner)
    }

    /// On a cluster, a share of the subscription to the channel of `scope` (a slot), for a
    /// waiter queued there; `None` on one server, whose one channel is always subscribed.
    pub(crate) fn listen(&self, scope: u16) -> Option<Box<dyn Listening>> {
        self.sharded.as_ref().map(|sharded| sharded.listen(scope))
    }

    /// On a cluster, subscribes the channel of `scope` again, if waiters are there: a grant
    /// on it went unheard. On one server, whose connection the actor checks itself, nothing.
    pub(crate) fn resubscribe(&self, scope: u16) {
        if let Some(sharded) = &self.sharded {
            sharded.resubscribe(scope);
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
        self.table.waiting()
    }
}

struct PubSubActor {
    dialer: Dialer,
    channel: String,
    command_timeout: Duration,
    table: WakeTable,
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

impl PubSubActor {
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
                    self.table.wake_all();
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

    /// Passes a grant to the waiter it names.
    fn deliver(&self, message: &redis::Msg) {
        self.table
            .deliver(message.get_channel_name(), message.get_payload_bytes());
    }

    async fn connect(&mut self) {
        let connected = timeout(self.command_timeout, async {
            let client = self.dialer.client().await?;
            let (mut sink, stream) = client.get_async_pubsub().await?.split();
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
                self.table.wake_all();
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
        self.table.wake_all();
        self.retry_later(reason);
    }
}
