//! The notification actor: ONE pub/sub connection per client serves every waiter.
//!
//! Waiters register a channel in a shared, reference-counted table (no await, no round trip)
//! and nudge the actor, which subscribes and unsubscribes in batches, so a burst of new
//! waiters costs one SUBSCRIBE. A waiter learns when its subscription is confirmed and when a
//! release was announced through a `watch` value, so a message that lands between two looks
//! is never lost. After a lost connection the actor reconnects with backoff, subscribes every
//! channel again and wakes every waiter, because messages may have been missed meanwhile.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{Instant, sleep_until, timeout};

/// Channels per SUBSCRIBE or UNSUBSCRIBE command.
const BATCH: usize = 1_000;
/// First reconnect delay after the connection is lost; doubles on each failure.
const MIN_BACKOFF: Duration = Duration::from_millis(50);
/// Longest delay between reconnect attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// How often an idle connection is checked with PING, so a silently dead one is noticed.
const PING_INTERVAL: Duration = Duration::from_secs(5);

/// What a waiter sees of its channel.
#[derive(Debug, Clone, Copy, Default)]
struct Signal {
    /// Bumped on every release message, reconnect and shutdown.
    wakeups: u64,
    /// The server has confirmed the subscription on the current connection.
    confirmed: bool,
}

#[derive(Debug)]
struct Channel {
    refs: usize,
    signal: watch::Sender<Signal>,
}

#[derive(Debug, Default)]
struct Channels {
    map: HashMap<String, Channel>,
    /// Channels whose subscription may need to change at the server.
    dirty: HashSet<String>,
}

impl Channels {
    fn wake_all(&self, confirmed: Option<bool>) {
        for channel in self.map.values() {
            channel.signal.send_modify(|signal| {
                signal.wakeups += 1;
                if let Some(confirmed) = confirmed {
                    signal.confirmed = confirmed;
                }
            });
        }
    }
}

#[derive(Debug)]
enum Command {
    Flush,
    Shutdown(oneshot::Sender<()>),
}

/// Handle on the notification actor. Cheap to clone; the actor ends with the last handle.
#[derive(Debug, Clone)]
pub(crate) struct PubSub {
    channels: Arc<Mutex<Channels>>,
    commands: mpsc::UnboundedSender<Command>,
}

/// One waiter's interest in one channel; dropping it releases the subscription.
#[derive(Debug)]
pub(crate) struct Subscription {
    pubsub: PubSub,
    channel: String,
    signal: watch::Receiver<Signal>,
}

impl PubSub {
    /// Spawns the actor on the current runtime. It connects in the background, so a Redis
    /// that is down at start only delays wake-ups (waiters poll meanwhile).
    pub(crate) fn start(client: redis::Client, command_timeout: Duration) -> Self {
        let (commands, receiver) = mpsc::unbounded_channel();
        let channels = Arc::new(Mutex::new(Channels::default()));
        let actor = Actor {
            client,
            command_timeout,
            channels: channels.clone(),
            commands: receiver,
            connection: None,
            server: HashSet::new(),
            resync: true,
            backoff: MIN_BACKOFF,
            reconnect_at: Instant::now(),
        };
        tokio::spawn(actor.run());
        Self { channels, commands }
    }

    /// Registers interest in `channel`. The subscription is made in the background; await
    /// [`Subscription::confirmed`] before relying on messages.
    pub(crate) fn subscribe(&self, channel: &str) -> Subscription {
        let (signal, created) = {
            let mut channels = self.channels.lock().expect("pubsub channels");
            let created = !channels.map.contains_key(channel);
            let entry = channels
                .map
                .entry(channel.to_owned())
                .or_insert_with(|| Channel {
                    refs: 0,
                    signal: watch::Sender::new(Signal::default()),
                });
            entry.refs += 1;
            let signal = entry.signal.subscribe();
            if created {
                channels.dirty.insert(channel.to_owned());
            }
            (signal, created)
        };
        if created {
            let _ = self.commands.send(Command::Flush);
        }
        Subscription {
            pubsub: self.clone(),
            channel: channel.to_owned(),
            signal,
        }
    }

    /// Stops the actor and wakes every waiter.
    pub(crate) async fn shutdown(&self) {
        let (done, finished) = oneshot::channel();
        if self.commands.send(Command::Shutdown(done)).is_ok() {
            let _ = finished.await;
        }
    }

    /// How many channels this client is subscribed to or about to be.
    pub(crate) fn channel_count(&self) -> usize {
        self.channels.lock().expect("pubsub channels").map.len()
    }
}

impl Subscription {
    /// Waits until the server confirmed the subscription, for at most `bound`; without
    /// confirmation (Redis down) the waiter goes on and polls.
    pub(crate) async fn confirmed(&mut self, bound: Duration) {
        let _ = timeout(bound, self.signal.wait_for(|signal| signal.confirmed)).await;
    }

    /// Marks every wake-up so far as seen; call before each look at the lock.
    pub(crate) fn mark_seen(&mut self) {
        self.signal.borrow_and_update();
    }

    /// Sleeps until a wake-up not yet seen, or `bound`.
    pub(crate) async fn wait(&mut self, bound: Duration) {
        let deadline = Instant::now() + bound;
        if let Ok(Err(_)) = timeout(bound, self.signal.changed()).await {
            // The channel's sender is gone (only if the table was torn down): poll instead.
            sleep_until(deadline).await;
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let removed = {
            let mut channels = self.pubsub.channels.lock().expect("pubsub channels");
            let last = channels.map.get_mut(&self.channel).is_some_and(|entry| {
                entry.refs -= 1;
                entry.refs == 0
            });
            if last {
                channels.map.remove(&self.channel);
                channels.dirty.insert(std::mem::take(&mut self.channel));
            }
            last
        };
        if removed {
            let _ = self.pubsub.commands.send(Command::Flush);
        }
    }
}

struct Actor {
    client: redis::Client,
    command_timeout: Duration,
    channels: Arc<Mutex<Channels>>,
    commands: mpsc::UnboundedReceiver<Command>,
    connection: Option<(PubSubSink, PubSubStream)>,
    /// Channels the current connection is subscribed to.
    server: HashSet<String>,
    /// Every channel must be subscribed again (new connection).
    resync: bool,
    backoff: Duration,
    reconnect_at: Instant,
}

enum Event {
    Command(Option<Command>),
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
                    command = self.commands.recv() => Event::Command(command),
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
                Event::Command(None) => break,
                Event::Command(Some(Command::Shutdown(done))) => {
                    self.channels
                        .lock()
                        .expect("pubsub channels")
                        .wake_all(None);
                    let _ = done.send(());
                    break;
                }
                Event::Command(Some(Command::Flush)) => {}
                Event::Message(Some(message)) => self.deliver(&message),
                Event::Message(None) => self.disconnect("the pub/sub connection closed"),
                Event::Reconnect => self.connect().await,
                Event::Ping => self.ping().await,
            }
            if self.connection.is_some()
                && let Err(err) = self.flush().await
            {
                self.disconnect(&err.to_string());
            }
        }
    }

    fn deliver(&self, message: &redis::Msg) {
        let channels = self.channels.lock().expect("pubsub channels");
        if let Some(channel) = channels.map.get(message.get_channel_name()) {
            channel.signal.send_modify(|signal| signal.wakeups += 1);
        }
    }

    async fn connect(&mut self) {
        match timeout(self.command_timeout, self.client.get_async_pubsub()).await {
            Ok(Ok(pubsub)) => {
                tracing::debug!("pub/sub connection established");
                self.connection = Some(pubsub.split());
                self.server.clear();
                self.resync = true;
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
        self.server.clear();
        self.resync = true;
        // Waiters look at their locks again at once and poll until the resubscription.
        self.channels
            .lock()
            .expect("pubsub channels")
            .wake_all(Some(false));
        self.retry_later(reason);
    }

    /// Brings the server's subscriptions in line with the table.
    async fn flush(&mut self) -> redis::RedisResult<()> {
        let resync = self.resync;
        let (subscribe, unsubscribe) = {
            let mut channels = self.channels.lock().expect("pubsub channels");
            let dirty: Vec<String> = if resync {
                channels.dirty.clear();
                channels.map.keys().cloned().collect()
            } else {
                channels.dirty.drain().collect()
            };
            let (mut subscribe, mut unsubscribe) = (Vec::new(), Vec::new());
            for name in dirty {
                match (channels.map.get(&name), self.server.contains(&name)) {
                    (Some(_), false) => subscribe.push(name),
                    // Dropped and wanted again before the unsubscribe went out.
                    (Some(channel), true) => {
                        channel.signal.send_if_modified(|signal| {
                            !std::mem::replace(&mut signal.confirmed, true)
                        });
                    }
                    (None, true) => unsubscribe.push(name),
                    (None, false) => {}
                }
            }
            (subscribe, unsubscribe)
        };
        let Some((sink, _)) = self.connection.as_mut() else {
            return Ok(());
        };
        let limit = self.command_timeout;
        for batch in unsubscribe.chunks(BATCH) {
            bounded(limit, sink.unsubscribe(batch)).await?;
            for name in batch {
                self.server.remove(name);
            }
        }
        for batch in subscribe.chunks(BATCH) {
            bounded(limit, sink.subscribe(batch)).await?;
            self.server.extend(batch.iter().cloned());
            let channels = self.channels.lock().expect("pubsub channels");
            for name in batch {
                if let Some(channel) = channels.map.get(name) {
                    channel.signal.send_modify(|signal| {
                        signal.confirmed = true;
                        if resync {
                            signal.wakeups += 1;
                        }
                    });
                }
            }
        }
        if resync {
            self.resync = false;
            self.backoff = MIN_BACKOFF;
        }
        Ok(())
    }
}

async fn bounded(
    limit: Duration,
    command: impl std::future::Future<Output = redis::RedisResult<()>>,
) -> redis::RedisResult<()> {
    timeout(limit, command).await.unwrap_or_else(|_| {
        Err(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "pub/sub command timed out",
        )))
    })
}
