//! The state every part of the engine shares: the settings, the connections, the two actors,
//! this client's instance id and whether it was shut down. It sits beneath everything that
//! holds it (as mini-redis's `Shared` and deadpool's `PoolInner` do): the acquisitions, the
//! waiters and the give-backs reach it, and it reaches none of them.

use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::engine::call_queue::{CallQueues, QueuedLook, QueuedRelease};
use crate::engine::config::{Config, MAX_INSTANCE_NAME};
use crate::engine::epoch::Epoch;
use crate::engine::giveback_tracker::GiveBackTracker;
use crate::engine::promotion_witness::PromotionWitness;
use crate::engine::pubsub::{PubSub, WakeSource};
use crate::engine::sharded::WakeChannels;
use crate::engine::watchdog::{Watchdog, WatchdogTiming};
use crate::error::{LockError, Result};
use crate::keys::LockKeys;
use crate::meter;
use crate::scopes::{Placement, ScopeKeys};
use crate::wire::conn::Connections;

/// Room for an owner id on the stack: the longest instance id (a name, `.` and 32 hex digits),
/// `:` and a holder number of up to 20 digits.
const OWNER_ID_ROOM: usize = MAX_INSTANCE_NAME + 1 + 32 + 1 + 20;

/// The shared state of one client and its clones.
#[derive(Debug)]
pub(crate) struct ClientState {
    pub(crate) config: Config,
    pub(crate) connections: Arc<Connections>,
    pub(crate) watchdog: Watchdog,
    pub(crate) pubsub: PubSub,
    promotion_witness: PromotionWitness,
    pub(crate) runtime: tokio::runtime::Handle,
    /// Where each lock's epoch key and wake channel are.
    pub(crate) placement: Arc<Placement>,
    /// Which Redis this is, without credentials (`host:port/db`).
    pub(crate) server: String,
    pub(crate) instance_id: String,
    next_holder: AtomicU64,
    shut_down: AtomicBool,
    /// The give-backs under way, which shutdown lets finish.
    pub(crate) give_backs: GiveBackTracker,
    /// First looks gathered while one of their connection is in flight (one server).
    pub(crate) look_queues: CallQueues<QueuedLook>,
    /// Last releases gathered while one of their connection is in flight (one server).
    pub(crate) release_queues: CallQueues<QueuedRelease>,
}

impl ClientState {
    /// Starts the watchdog, the pub/sub actor and the promotion witness on the current
    /// runtime, for a client of `server` (its wake-ups heard through `wake_source`) with a
    /// random instance id (after its name, if it has one), and the client's metric series at 0.
    pub(crate) fn start(
        config: Config,
        connections: Arc<Connections>,
        wake_source: WakeSource,
        server: String,
    ) -> Self {
        let random = rand::random::<u128>();
        let instance_id = match &config.instance_name {
            Some(name) => format!("{name}.{random:032x}"),
            None => format!("{random:032x}"),
        };
        let placement = Arc::new(match wake_source {
            WakeSource::Server(_) => Placement::single(&config.prefix),
            WakeSource::Cluster(_) => Placement::cluster(&config.prefix, config.command_timeout),
        });
        let watchdog = Watchdog::start(
            connections.clone(),
            placement.clone(),
            WatchdogTiming::of(&config),
            Epoch::new(
                placement.clone(),
                config.lease_limit,
                config.restart_keeps_writes,
            ),
        );
        let channels = WakeChannels {
            placement: placement.clone(),
            instance_id: instance_id.clone(),
            command_timeout: config.command_timeout,
        };
        let pubsub = PubSub::start(wake_source, channels);
        let promotion_witness =
            PromotionWitness::start(connections.clone(), placement.clone(), config.lease_limit);
        meter::start_at_zero();
        let shards = connections.shard_count();
        Self {
            look_queues: CallQueues::new(shards),
            release_queues: CallQueues::new(shards),
            connections,
            promotion_witness,
            watchdog,
            pubsub,
            runtime: tokio::runtime::Handle::current(),
            placement,
            server,
            instance_id,
            next_holder: AtomicU64::new(1),
            shut_down: AtomicBool::new(false),
            give_backs: GiveBackTracker::default(),
            config,
        }
    }

    pub(crate) fn ensure_running(&self) -> Result<()> {
        if self.is_shut_down() {
            return Err(LockError::shut_down());
        }
        Ok(())
    }

    /// Whether the client was shut down.
    pub(crate) fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::SeqCst)
    }

    /// Releases every lock the watchdog holds, wakes every waiter, and stops the actors, the
    /// promotion witness and the pool.
    pub(crate) async fn shutdown(&self) {
        self.shut_down.store(true, Ordering::SeqCst);
        // A give-back makes one more try once shut down (it stops retrying): long enough for
        // that try, on its connection and on a fresh one.
        self.give_backs
            .settled(self.config.command_timeout * 2)
            .await;
        self.watchdog.shutdown().await;
        self.pubsub.shutdown().await;
        self.promotion_witness.stop();
        self.connections.close();
    }

    /// The epoch key and wake channel of the lock with `keys`.
    pub(crate) fn scope_keys(&self, keys: &LockKeys) -> &ScopeKeys {
        self.placement.of(keys)
    }

    /// A fresh owner id: `<instance id>:<holder number>`.
    pub(crate) fn new_owner(&self) -> Arc<str> {
        let id = self.new_holder_id();
        // Written on the stack and copied once into its `Arc`: every acquisition makes one,
        // and a formatted `String` would cost two allocations more.
        let mut room = [0u8; OWNER_ID_ROOM];
        let mut free = &mut room[..];
        if write!(free, "{}:{id}", self.instance_id).is_ok() {
            let written = OWNER_ID_ROOM - free.len();
            if let Ok(owner) = std::str::from_utf8(&room[..written]) {
                return owner.into();
            }
        }
        format!("{}:{id}", self.instance_id).into()
    }

    /// A number no other holder of this client has (the watchdog's id for a lease).
    pub(crate) fn new_holder_id(&self) -> u64 {
        self.next_holder.fetch_add(1, Ordering::Relaxed)
    }
}
