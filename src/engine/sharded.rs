//! The cluster's notification actor: sharded pub/sub, one connection per node (the cluster
//! client's), and one channel per slot this instance waits in, whatever the number of locks.
//!
//! A release in a cluster SPUBLISHes the grant on `<prefix>wake:{<slot tag>}:<instance id>`,
//! in the lock's own slot (see `scopes.rs`). Waiters share the subscription of their slot:
//! the first to queue there subscribes (SSUBSCRIBE, routed by the cluster client to the
//! slot's node), and the channel is given up a while after the last one left. The cluster
//! client moves the subscriptions when the slot map changes or a node reconnects; a channel
//! the server drops (its slot migrated away) is subscribed again here. Whenever a grant may have gone unheard (a reconnect, a
//! resubscription, a lost connection), every waiter looks at its lock again, and the re-poll
//! bound caps the rest.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{PushInfo, PushKind, Value};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{Instant, sleep_until, timeout};

use crate::engine::wake::{Listening, WakeTable};
use crate::scopes::{Placement, slot_of};

/// First delay before a failed subscription is tried again; doubles on each failure.
const MIN_BACKOFF: Duration = Duration::from_millis(50);
/// Longest delay between attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// How long a slot's channel stays subscribed after its last waiter left: a slot waited in
/// once is likely waited in again soon, and a subscription costs two commands.
const LINGER: Duration = Duration::from_secs(30);

/// The waiters of each slot this instance listens in.
type Scopes = Arc<Mutex<HashMap<u16, Scope>>>;

#[derive(Debug)]
struct Scope {
    waiters: usize,
    /// `true` once the server confirmed the subscription.
    ready: watch::Sender<bool>,
}

/// What the actor is asked to do.
#[derive(Debug)]
enum Request {
    /// Subscribe to the slot's channel (again), unless nobody waits there any more.
    Subscribe(u16),
    /// Unsubscribe, unless waiters came back meanwhile.
    Unsubscribe(u16),
    /// Subscribe again even if subscribed as far as this actor knows (a grant went unheard).
    Resubscribe(u16),
}

/// The wake channels a client listens on: each named by its scope's wake prefix and the
/// instance's id, and how long a subscription may take.
#[derive(Debug, Clone)]
pub(crate) struct WakeChannels {
    pub(crate) placement: Arc<Placement>,
    pub(crate) instance_id: String,
    pub(crate) command_timeout: Duration,
}

/// Handle on the sharded notification actor.
#[derive(Debug, Clone)]
pub(crate) struct Sharded {
    scopes: Scopes,
    requests: mpsc::UnboundedSender<Request>,
}

impl Sharded {
    /// Spawns the actor on the current runtime, for this instance's channels; it connects
    /// when the first waiter queues.
    pub(crate) fn start(
        builder: ClusterClientBuilder,
        table: WakeTable,
        channels: WakeChannels,
        shutdown: mpsc::UnboundedReceiver<oneshot::Sender<()>>,
    ) -> Self {
        let WakeChannels {
            placement,
            instance_id,
            command_timeout,
        } = channels;
        let (pushes_in, pushes) = mpsc::unbounded_channel();
        let (requests, requests_in) = mpsc::unbounded_channel();
        let scopes = Scopes::default();
        let client = builder
            .use_protocol(redis::ProtocolVersion::RESP3)
            .push_sender(pushes_in)
            .build();
        let actor = ShardedPubSubActor {
            client,
            connection: None,
            table,
            placement,
            instance_id,
            command_timeout,
            scopes: scopes.clone(),
            confirmed: HashSet::new(),
            own_confirmations: HashMap::new(),
            lingering: HashMap::new(),
            linger_order: VecDeque::new(),
            retry: HashSet::new(),
            backoff: MIN_BACKOFF,
            retry_at: None,
            requests_in,
            requests: requests.clone(),
            pushes,
            shutdown,
        };
        tokio::spawn(actor.run());
        Self { scopes, requests }
    }

    /// A waiter's share of the subscription of `scope` (its slot).
    pub(crate) fn listen(&self, scope: u16) -> Box<dyn Listening> {
        let mut scopes = self.scopes.lock().expect("sharded scopes");
        let entry = scopes.entry(scope).or_insert_with(|| {
            let _ = self.requests.send(Request::Subscribe(scope));
            Scope {
                waiters: 0,
                ready: watch::channel(false).0,
            }
        });
        entry.waiters += 1;
        Box::new(Share {
            scope,
            ready: entry.ready.subscribe(),
            scopes: self.scopes.clone(),
            requests: self.requests.clone(),
        })
    }
}

impl Sharded {
    /// Subscribes the channel of `scope` again, whatever this actor believes of it.
    pub(crate) fn resubscribe(&self, scope: u16) {
        let _ = self.requests.send(Request::Resubscribe(scope));
    }
}

/// One waiter's share of a slot's subscription.
#[derive(Debug)]
struct Share {
    scope: u16,
    ready: watch::Receiver<bool>,
    scopes: Scopes,
    requests: mpsc::UnboundedSender<Request>,
}

impl Listening for Share {
    fn ready(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        let mut ready = self.ready.clone();
        Box::pin(async move {
            let _ = ready.wait_for(|ready| *ready).await;
        })
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut scopes = self.scopes.lock().expect("sharded scopes");
        if let Some(entry) = scopes.get_mut(&self.scope) {
            entry.waiters -= 1;
            if entry.waiters == 0 {
                scopes.remove(&self.scope);
                let _ = self.requests.send(Request::Unsubscribe(self.scope));
            }
        }
    }
}

struct ShardedPubSubActor {
    client: redis::RedisResult<redis::cluster::ClusterClient>,
    connection: Option<ClusterConnection>,
    table: WakeTable,
    placement: Arc<Placement>,
    instance_id: String,
    command_timeout: Duration,
    scopes: Scopes,
    /// Slots whose subscription the server confirmed: a confirmation of one of them again
    /// is a resubscription, after which grants may have been missed.
    confirmed: HashSet<u16>,
    /// Confirmations still to come of this actor's own subscriptions, by slot.
    own_confirmations: HashMap<u16, usize>,
    /// Slots nobody waits in any more, and when their channel is given up.
    lingering: HashMap<u16, Instant>,
    /// The same, in the order they are due (stale entries are skipped).
    linger_order: VecDeque<(Instant, u16)>,
    /// Slots to subscribe to once the backoff passes.
    retry: HashSet<u16>,
    backoff: Duration,
    retry_at: Option<Instant>,
    requests_in: mpsc::UnboundedReceiver<Request>,
    requests: mpsc::UnboundedSender<Request>,
    pushes: mpsc::UnboundedReceiver<PushInfo>,
    shutdown: mpsc::UnboundedReceiver<oneshot::Sender<()>>,
}

enum Event {
    Shutdown(Option<oneshot::Sender<()>>),
    Request(Request),
    Push(PushInfo),
    Retry,
    Linger,
}

impl ShardedPubSubActor {
    async fn run(mut self) {
        loop {
            let retry_at = self.retry_at;
            let linger_at = self.linger_order.front().map(|(at, _)| *at);
            let event = tokio::select! {
                done = self.shutdown.recv() => Event::Shutdown(done),
                Some(request) = self.requests_in.recv() => Event::Request(request),
                Some(push) = self.pushes.recv() => Event::Push(push),
                _ = sleep_until(retry_at.unwrap_or_else(Instant::now)), if retry_at.is_some()
                    => Event::Retry,
                _ = sleep_until(linger_at.unwrap_or_else(Instant::now)), if linger_at.is_some()
                    => Event::Linger,
            };
            match event {
                Event::Shutdown(done) => {
                    self.table.wake_all();
                    if let Some(done) = done {
                        let _ = done.send(());
                    }
                    return;
                }
                Event::Request(Request::Subscribe(scope)) => self.subscribe(scope).await,
                Event::Request(Request::Unsubscribe(scope)) => self.unsubscribe(scope).await,
                Event::Request(Request::Resubscribe(scope)) => {
                    self.forget(scope);
                    self.subscribe(scope).await;
                }
                Event::Push(push) => self.heard(push),
                Event::Retry => {
                    self.retry_at = None;
                    for scope in std::mem::take(&mut self.retry) {
                        self.subscribe(scope).await;
                    }
                }
                Event::Linger => self.give_up_lingering().await,
            }
        }
    }

    fn channel(&self, scope: u16) -> String {
        let prefix = &self.placement.scope_keys(scope).wake_prefix;
        format!("{prefix}{}", self.instance_id)
    }

    /// The cluster connection, made on first use.
    async fn connection(&mut self) -> redis::RedisResult<&mut ClusterConnection> {
        if self.connection.is_none() {
            let client = self.client.as_ref().map_err(Clone::clone)?;
            self.connection = Some(client.get_async_connection().await?);
        }
        Ok(self.connection.as_mut().expect("connected"))
    }

    async fn subscribe(&mut self, scope: u16) {
        let wanted = self.wanted(scope);
        if !wanted {
            return;
        }
        if self.lingering.remove(&scope).is_some() && self.confirmed.contains(&scope) {
            // Still subscribed: ready at once.
            self.set_ready(scope);
            return;
        }
        let channel = self.channel(scope);
        let limit = self.command_timeout;
        *self.own_confirmations.entry(scope).or_default() += 1;
        let outcome = timeout(limit, async {
            self.connection().await?.ssubscribe(&channel).await
        })
        .await
        .unwrap_or_else(|_| {
            Err(redis::RedisError::from(std::io::Error::from(
                std::io::ErrorKind::TimedOut,
            )))
        });
        match outcome {
            Ok(()) => {
                self.backoff = MIN_BACKOFF;
                self.confirmed.insert(scope);
                self.set_ready(scope);
            }
            Err(err) => {
                tracing::warn!(
                    channel,
                    error = %err,
                    retry_in_ms = self.backoff.as_millis() as u64,
                    "sharded subscription failed"
                );
                // The connection is kept: the cluster client reconnects its nodes itself, and a
                // second one would hold a second pub/sub connection per node.
                self.retry.insert(scope);
                self.retry_at = Some(Instant::now() + self.backoff);
                self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
                // Meanwhile the waiters of this slot poll.
                self.table.wake_all();
            }
        }
    }

    /// Whether waiters are in `scope` now.
    fn wanted(&self, scope: u16) -> bool {
        self.scopes
            .lock()
            .expect("sharded scopes")
            .contains_key(&scope)
    }

    /// Forgets that `scope`'s channel is subscribed.
    fn forget(&mut self, scope: u16) {
        self.confirmed.remove(&scope);
        self.lingering.remove(&scope);
    }

    fn set_ready(&self, scope: u16) {
        if let Some(entry) = self.scopes.lock().expect("sharded scopes").get(&scope) {
            entry.ready.send_replace(true);
        }
    }

    /// The last waiter of `scope` left: its channel lingers for a while.
    async fn unsubscribe(&mut self, scope: u16) {
        let wanted = self.wanted(scope);
        if wanted || !self.confirmed.contains(&scope) {
            return;
        }
        let at = Instant::now() + LINGER;
        self.lingering.insert(scope, at);
        self.linger_order.push_back((at, scope));
    }

    /// Unsubscribes the channels that lingered long enough with nobody waiting.
    async fn give_up_lingering(&mut self) {
        let now = Instant::now();
        while let Some((at, scope)) = self.linger_order.front().copied() {
            if at > now {
                break;
            }
            self.linger_order.pop_front();
            if self.lingering.get(&scope) != Some(&at) {
                continue;
            }
            self.lingering.remove(&scope);
            let wanted = self.wanted(scope);
            if wanted || !self.confirmed.remove(&scope) {
                continue;
            }
            let channel = self.channel(scope);
            let limit = self.command_timeout;
            if let Some(connection) = self.connection.as_mut()
                && let Ok(Err(err)) = timeout(limit, connection.sunsubscribe(&channel)).await
            {
                tracing::debug!(channel, error = %err, "sharded unsubscription failed");
            }
        }
    }

    /// A push from a node: a grant, or news of the subscriptions.
    fn heard(&mut self, push: PushInfo) {
        let channel = match push.data.first() {
            Some(Value::BulkString(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
            _ => String::new(),
        };
        match push.kind {
            PushKind::SMessage => {
                if let Some(Value::BulkString(payload)) = push.data.get(1) {
                    self.table.deliver(&channel, payload);
                }
            }
            PushKind::SSubscribe => {
                let scope = slot_of(&channel);
                match self.own_confirmations.get_mut(&scope) {
                    Some(count) if *count > 0 => *count -= 1,
                    // Subscribed again by the cluster client after a reconnect or a move:
                    // grants may have gone unheard.
                    _ if self.confirmed.contains(&scope) => self.table.wake_all(),
                    _ => {}
                }
            }
            // Dropped by the server (the slot migrated away), or by ourselves: subscribe
            // again where the slot is now if waiters remain.
            PushKind::SUnsubscribe => {
                let scope = slot_of(&channel);
                let wanted = self.wanted(scope);
                // No longer subscribed, whoever asked (a lingering channel included).
                self.forget(scope);
                if wanted {
                    let _ = self.requests.send(Request::Subscribe(scope));
                    self.table.wake_all();
                }
            }
            // A node's connection closed: the subscriptions it held may be gone with it, and
            // are made again (the server confirms those it still has).
            PushKind::Disconnection => {
                let wanted: Vec<u16> = self
                    .scopes
                    .lock()
                    .expect("sharded scopes")
                    .keys()
                    .copied()
                    .collect();
                self.confirmed.clear();
                self.lingering.clear();
                for scope in wanted {
                    let _ = self.requests.send(Request::Resubscribe(scope));
                }
                self.table.wake_all();
            }
            _ => {}
        }
    }
}
