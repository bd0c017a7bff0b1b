//! `LockClient`: the connection pool, the two actors, the local key table and the settings.

use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::Pool;
use futures_util::{StreamExt, TryStreamExt};

use crate::engine::Engine;
use crate::engine::config::{Config, ReplicaAck};
use crate::engine::pubsub::WakeSource;
use crate::engine::shared::ClientState;
use crate::error::{ErrorKind, LockError, Result};
use crate::keys::{DEFAULT_PREFIX, validate_prefix};
use crate::wire::cluster_node::url_of;
use crate::wire::conn::Connections;
use crate::wire::endpoint::Endpoint;
use crate::wire::fsync::every_write_synced;
use crate::wire::scripts;
use crate::wire::sentinel::Dialer;
use crate::wire::setup::{cluster_builder, create_pool};

/// Default lease of a watchdog-mode lock: renewed while held, gone this long after the
/// holder dies.
pub const DEFAULT_WATCHDOG_LEASE: Duration = Duration::from_secs(30);
/// Default bound on a waiter's sleep between looks at the lock, whatever pub/sub says.
pub const DEFAULT_REPOLL_INTERVAL: Duration = Duration::from_secs(1);
/// Default bound on one Redis round trip (checkout, script, reply).
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// Default for [`LockClientBuilder::connections`]: the command connections a client keeps
/// and spreads lock names over (one name always on the same connection).
pub const DEFAULT_CONNECTIONS: usize = 1;

/// Default for [`LockClientBuilder::local_handover_limit`]: consecutive hand-overs between
/// tasks of one client before the lock goes back through Redis.
pub const DEFAULT_LOCAL_HANDOVER_LIMIT: u32 = 16;
/// Default for [`LockClientBuilder::local_handover_window`]: how long after a Redis
/// acquisition the tasks of one client may keep handing the lock over among themselves.
pub const DEFAULT_LOCAL_HANDOVER_WINDOW: Duration = Duration::from_millis(25);

/// Default for [`LockClientBuilder::lease_limit`]: the longest lease a client grants, and how
/// long no lock is granted after Redis lost its data.
pub const DEFAULT_LEASE_LIMIT: Duration = Duration::from_secs(60);

/// Epoch scripts a waiver has on their way at once (a cluster has one epoch per slot).
const WAIVE_CONCURRENCY: usize = 256;

/// A client for distributed locks on one Redis. Cheap to clone: clones share the pool, the
/// watchdog, the pub/sub connection and the local key table.
///
/// The actors stop when [`LockClient::shutdown`] is called, or when the last clone and the
/// last guard are dropped.
#[derive(Debug, Clone)]
pub struct LockClient {
    pub(crate) engine: Arc<Engine>,
}

/// Builds a [`LockClient`]; see each method for its default. Its `Debug` output shows no
/// password and no certificate.
#[derive(Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct LockClientBuilder {
    pub(crate) endpoint: Endpoint,
    /// The seed URLs of a cluster, for a client of a Redis Cluster.
    cluster: Option<Vec<String>>,
    /// The sentinel URLs and the master's name, for a client of a master behind Sentinel.
    sentinel: Option<(Vec<String>, String)>,
    pool: Option<Pool>,
    pub(crate) config: Config,
    renew_interval: Option<Duration>,
}

impl LockClient {
    /// Connects to the Redis at `url` with the default settings:
    /// `redis://[[user]:password@]host:port[/db]`, or `rediss://…` for TLS (verified against
    /// the system's trust store; see [`LockClientBuilder::tls_root_certificate`] for your own
    /// certificate authority). A password without a user authenticates as `default`.
    ///
    /// Connections are made lazily: a Redis that is down at start makes operations fail
    /// with [`ErrorKind::RedisUnavailable`] until it is back, and the client recovers on its
    /// own; credentials or certificates Redis refuses make them fail with
    /// [`ErrorKind::AccessDenied`], and a node of a Redis Cluster (each connection it opens
    /// asks `INFO cluster`) with [`ErrorKind::InvalidConfig`]: use [`Self::builder_cluster`], or
    /// [`LockClientBuilder::points_to_cluster_node`] to tell. Must be called within a Tokio
    /// runtime.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: nothing is started before it returns.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidConfig`] when the URL cannot be parsed.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::builder(url).build().await
    }

    /// A builder for a client of the Redis Cluster that `seed_urls` reach (one or more of its
    /// nodes, each `redis://[[user]:password@]host:port`; the client learns the rest).
    ///
    /// Commands go through redis-rs's cluster client, which follows redirections (`MOVED`),
    /// node failovers and topology changes. In a slot that migrates, no script runs until
    /// the migration ends ([`crate::guide::topologies`]); holders keep their leases. Every script
    /// touches only keys of its lock's own slot: each slot has its own epoch key, so a node
    /// that fails over to a replica without the data quarantines and loses only its own
    /// slots' locks. Wake-ups use sharded pub/sub (SPUBLISH in the lock's slot, SSUBSCRIBE on
    /// the node that owns it), one channel per slot an instance waits in. Needs Redis 7.0.
    ///
    /// A multi-lock whose locks live in different slots takes them one by one, in the same
    /// canonical order as on one server. Custom TLS certificates and a pool of the caller's
    /// are for one server only ([`ErrorKind::InvalidConfig`] at [`LockClientBuilder::build`]).
    pub fn builder_cluster<I, S>(seed_urls: I) -> LockClientBuilder
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let seeds: Vec<String> = seed_urls
            .into_iter()
            .map(|url| url.as_ref().to_owned())
            .collect();
        let mut builder = Self::builder(seeds.first().map_or("", String::as_str));
        builder.cluster = Some(seeds);
        builder
    }

    /// A builder for a client of the master named `master_name` that the Redis Sentinels at
    /// `sentinel_urls` (each `redis://[[user]:password@]host:port` of a sentinel) monitor.
    ///
    /// Every new connection, for commands and for pub/sub, asks the sentinels for the master
    /// of the moment, so after a failover the client follows the new master: a command that
    /// fails on the old one drops its connection, and the next one goes where the sentinels
    /// point. A failover to a replica that had not received a lock is the known Redis hole:
    /// the old holder's next renewal on the new master finds the lock gone or taken, and its
    /// lost signal fires ([`LockClientBuilder::min_replicas_acked`] closes most of it).
    ///
    /// The master is reached without credentials and on database 0; custom TLS certificates
    /// and a pool of the caller's are for one server only ([`ErrorKind::InvalidConfig`] at
    /// [`LockClientBuilder::build`]).
    pub fn builder_sentinel<I, S>(sentinel_urls: I, master_name: &str) -> LockClientBuilder
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let urls: Vec<String> = sentinel_urls
            .into_iter()
            .map(|url| url.as_ref().to_owned())
            .collect();
        let mut builder = Self::builder(urls.first().map_or("", String::as_str));
        builder.sentinel = Some((urls, master_name.to_owned()));
        builder
    }

    /// A builder for a client of the Redis at `url` (not a cluster node: see [`Self::connect`]).
    pub fn builder(url: &str) -> LockClientBuilder {
        LockClientBuilder {
            endpoint: Endpoint::new(url),
            cluster: None,
            sentinel: None,
            pool: None,
            config: Config {
                prefix: DEFAULT_PREFIX.to_owned(),
                watchdog_lease: DEFAULT_WATCHDOG_LEASE,
                renew_interval: DEFAULT_WATCHDOG_LEASE / 3,
                repoll_interval: DEFAULT_REPOLL_INTERVAL,
                command_timeout: DEFAULT_COMMAND_TIMEOUT,
                local_handover_limit: DEFAULT_LOCAL_HANDOVER_LIMIT,
                local_handover_window: DEFAULT_LOCAL_HANDOVER_WINDOW,
                lease_limit: DEFAULT_LEASE_LIMIT,
                restart_keeps_writes: false,
                replica_ack: None,
                instance_name: None,
                connections: DEFAULT_CONNECTIONS,
                group_commit: false,
            },
            renew_interval: None,
        }
    }

    /// This client's instance id, the first part of every owner id: 128 bits from a CSPRNG
    /// (rand's `ThreadRng`, seeded by the operating system) as 32 hex digits, after the
    /// [instance name](LockClientBuilder::instance_name) and a `.` when there is one
    /// (`orders-7f9c.3b1f…`).
    pub fn instance_id(&self) -> &str {
        &self.engine.shared.instance_id
    }

    /// The Redis this client talks to, without credentials: `host:port/db` as the URL
    /// spells it (or `socket path/db`). Multi-locks order locks of several clients by it and
    /// quorum locks tell their servers apart by it, so every process should spell a server
    /// the same way.
    pub fn server(&self) -> &str {
        &self.engine.shared.server
    }

    /// How many lock names this client's tasks hold or await right now.
    pub fn local_keys(&self) -> usize {
        self.engine.local.len()
    }

    /// How many of this client's tasks wait in a Redis queue right now: at most one per
    /// lock name, whatever the number of tasks waiting for it locally.
    pub fn queued_waiters(&self) -> usize {
        self.engine.shared.pubsub.waiting()
    }

    /// Round trips to Redis this client has made on its command connection so far: every
    /// command and script, renewals included (pub/sub traffic is not counted). For
    /// benchmarks and metrics.
    pub fn round_trips(&self) -> u64 {
        self.engine.shared.connections.sent()
    }

    /// How long the restart quarantine this client last heard of still runs, if one runs:
    /// Redis lost its data, and no lock of it is granted until every holder of a lost lock has
    /// been told (see [`LockClientBuilder::lease_limit`]). Learned from the replies of
    /// this client's own acquisitions; a WARN log line marks its start and its end.
    pub fn restart_quarantine_left(&self) -> Option<Duration> {
        self.engine.shared.watchdog.epoch().quarantine_left()
    }

    /// Waives the restart quarantine of this client's Redis and key prefix, for operators: on
    /// a server known to be new (which the library cannot tell from one that lost its data,
    /// so its first lock would otherwise wait a quarantine), or once every holder of a lock
    /// the server lost is known to have stopped. Gives a server without an epoch its first
    /// one, with no quarantine; ends a quarantine that runs. Returns whether it waived one.
    /// `lockctl waive-quarantine` does the same from a shell.
    ///
    /// # Cancel safety
    ///
    /// Once sent, the script runs whether or not the caller waits for its answer: cancelling
    /// does not undo it.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::RedisUnavailable`] or [`ErrorKind::Redis`] when Redis fails,
    /// [`ErrorKind::AccessDenied`] when it refuses this client (credentials, ACL, certificate).
    pub async fn waive_restart_quarantine(&self) -> Result<bool> {
        let shared = &self.engine.shared;
        // One epoch on a server; one per slot on a cluster, each waived on its own node.
        let waived = futures_util::stream::iter(shared.placement.scopes())
            .map(|scope| async move {
                let key = &shared.placement.scope_keys(scope).epoch_key;
                shared
                    .connections
                    .run(key, |mut conn| async move {
                        scripts::waive_quarantine(&mut conn, key).await
                    })
                    .await
            })
            .buffer_unordered(WAIVE_CONCURRENCY)
            .try_fold(false, |any, waived| async move { Ok(any || waived) })
            .await?;
        if waived {
            shared.watchdog.epoch().waived();
        }
        Ok(waived)
    }

    /// The error of a wait bound that passed: [`ErrorKind::RestartQuarantine`] while a
    /// quarantine keeps every lock of this Redis from being granted, [`ErrorKind::Timeout`]
    /// otherwise. `what` says what was not acquired in time.
    pub(crate) fn wait_bound_error(&self, what: &str) -> LockError {
        match self.restart_quarantine_left() {
            Some(left) => LockError::restart_quarantine(what, left),
            None => LockError::timeout(what),
        }
    }

    /// Whether [`LockClient::shutdown`] was called.
    pub fn is_shut_down(&self) -> bool {
        self.engine.shared.is_shut_down()
    }

    /// Releases every lock this client holds (their lost signals fire with
    /// [`LostReason::ShutDown`](crate::LostReason::ShutDown)), wakes every waiter (they return
    /// [`ErrorKind::ShutDown`]), and stops both actors and the pool. It first lets what is
    /// being given back in the background finish (a wait given up, which Redis may have
    /// queued or granted), for up to twice the command timeout: a process that exits after
    /// it leaves no place in a queue, to which a lock would be granted for a whole lease.
    ///
    /// # Cancel safety
    ///
    /// Cancelling leaves the shutdown begun: the client refuses new work at once, and what
    /// it held is released when its lease runs out if the release was not sent yet.
    pub async fn shutdown(&self) {
        self.engine.shared.shutdown().await;
    }
}

impl LockClientBuilder {
    /// Uses an existing pool for commands instead of creating one (default: a pool from the
    /// URL of as many connections as [`Self::connections`] says, all of which the client
    /// keeps). The client keeps that many connections of a pool it is given checked out (at
    /// most the pool's size), since the pool may serve others too. The URL (and the TLS
    /// settings) are still used for the pub/sub connection, which never comes from a pool; a
    /// pool you bring authenticates and uses TLS as you set it up.
    ///
    /// The connections the client keeps answer within the client's command timeout only: a
    /// response timeout of the pool's own is lifted on them, since a reply cut off by the
    /// connection could no longer be undone once the caller has gone.
    pub fn pool(mut self, pool: Pool) -> Self {
        self.pool = Some(pool);
        self
    }

    /// Spreads lock names over this many command connections (default
    /// [`DEFAULT_CONNECTIONS`], 1), each name always on the same one; the pub/sub connection
    /// comes on top. One multiplexed connection pipelines every task's commands, and Redis
    /// reads and answers a batch of them per system call: one connection costs Redis the
    /// least per lock (about a fifth less CPU than four in the load benchmark), and a fleet
    /// of instances the fewest connections. More let one busy instance's commands travel on
    /// more sockets at once, for a client whose single connection cannot carry its lock rate.
    /// A cluster client keeps one connection per node whatever this says.
    ///
    /// Checked by [`Self::build`]: from 1 to [`MAX_CONNECTIONS`](crate::MAX_CONNECTIONS), or
    /// [`ErrorKind::InvalidConfig`].
    pub fn connections(mut self, connections: usize) -> Self {
        self.config.connections = connections;
        self
    }

    /// Group commit (default off): on one server, the first look of an acquisition of an
    /// exclusive or fair lock, and the last release of one granted from its queue (one taken
    /// with nobody queued goes out as two plain commands, which cost Redis less still), go
    /// out at once when none of their kind is in flight on their connection; those that come
    /// while one is wait, and go out together as one call when it ends. Each lock gets what
    /// it would get alone. For a deployment whose Redis CPU is the limit: when many tasks of
    /// an instance lock at once, Redis does about a third less work per lock, and each
    /// request that waited for a call in flight takes up to one round trip longer. On a
    /// machine where clients and Redis share the cores, the longer wait costs more rate than
    /// the work saved (see `docs/benchmarks.md`). A cluster client sends each call alone
    /// whatever this says.
    pub fn group_commit(mut self, on: bool) -> Self {
        self.config.group_commit = on;
        self
    }

    /// Prefix of every key (default [`DEFAULT_PREFIX`], `"lock:"`). Must not contain `{` or
    /// `}`.
    pub fn key_prefix(mut self, prefix: &str) -> Self {
        self.config.prefix = prefix.to_owned();
        self
    }

    /// Lease of watchdog-mode locks (default [`DEFAULT_WATCHDOG_LEASE`], 30 s), from 3 ms to
    /// the [lease limit](Self::lease_limit). The watchdog renews it every third of this unless
    /// [`Self::renew_interval`] says otherwise.
    pub fn watchdog_lease(mut self, lease: Duration) -> Self {
        self.config.watchdog_lease = lease;
        self
    }

    /// How often the watchdog renews (default: a third of the watchdog lease). At most half
    /// the lease, so that one renewal may fail and the next still comes in time.
    pub fn renew_interval(mut self, interval: Duration) -> Self {
        self.renew_interval = Some(interval);
        self
    }

    /// Longest sleep of a waiter between looks at the lock (default
    /// [`DEFAULT_REPOLL_INTERVAL`], 1 s): what a missed release message can cost at most.
    /// Positive and at most a third of [`MAX_LEASE`](crate::MAX_LEASE): a waiter's place in
    /// a queue lives three of these without a refresh.
    pub fn repoll_interval(mut self, interval: Duration) -> Self {
        self.config.repoll_interval = interval;
        self
    }

    /// Bound on one Redis round trip (default [`DEFAULT_COMMAND_TIMEOUT`], 2 s); past it
    /// the operation fails with [`ErrorKind::RedisUnavailable`]. Positive and at most
    /// [`MAX_LEASE`](crate::MAX_LEASE).
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.config.command_timeout = timeout;
        self
    }

    /// Most consecutive hand-overs of a lock between tasks of this client, without a Redis
    /// round trip, before the lock goes back through Redis so other instances get their turn
    /// (default [`DEFAULT_LOCAL_HANDOVER_LIMIT`], 16; 0 turns local hand-over off; at most
    /// [`MAX_LOCAL_HANDOVER_LIMIT`](crate::MAX_LOCAL_HANDOVER_LIMIT), 1,000). Each acquisition
    /// reserves up to this many fencing tokens more ([`crate::guide::internals`]).
    pub fn local_handover_limit(mut self, limit: u32) -> Self {
        self.config.local_handover_limit = limit;
        self
    }

    /// How long after a Redis acquisition the lock may keep passing between tasks of this
    /// client (default [`DEFAULT_LOCAL_HANDOVER_WINDOW`], 25 ms): the longest another
    /// instance waits for this client's tasks beyond their own critical sections. Shorter
    /// than nine tenths of the watchdog lease, the deadline by which a holder is told its
    /// lease is lost.
    pub fn local_handover_window(mut self, window: Duration) -> Self {
        self.config.local_handover_window = window;
        self
    }

    /// The longest lease this client grants (default [`DEFAULT_LEASE_LIMIT`], 60 s), and the
    /// restart quarantine: how long no lock is granted once Redis lost its data. A
    /// [`Lease::Fixed`](crate::Lease::Fixed) above it is refused with
    /// [`ErrorKind::InvalidConfig`] before anything is written, and the watchdog lease must be
    /// at most it. Give every client of one Redis the same limit: a client that finds the data
    /// lost knows of no lease but its own limit (and the longest granted in the lost epoch,
    /// when it saw that epoch).
    ///
    /// A Redis that lost its data (its epoch key gone, or restarted from files that may miss
    /// writes) is found by the first script that runs there and quarantined: no lock is
    /// granted until every lease granted before has run out, so a holder cut off from Redis
    /// is told by its own lost signal first; holders that reach Redis are told at their next
    /// command or watchdog tick ([`LostReason::DataLost`](crate::LostReason::DataLost)).
    ///
    /// The quarantine is counted from the server's start (`uptime_in_seconds`), as the
    /// Redlock design's delayed restarts are; a server up longer (new, or one that never held
    /// a lock) grants its first lock at once. A loss Redis shows without a restart (a flush,
    /// an eviction, a promoted replica) is quarantined this long from when a client finds it.
    /// [`LockClient::waive_restart_quarantine`] (`lockctl waive-quarantine`) ends a quarantine
    /// once every holder is known to have stopped. At most [`MAX_LEASE`](crate::MAX_LEASE).
    pub fn lease_limit(mut self, limit: Duration) -> Self {
        self.config.lease_limit = limit;
        self
    }

    /// Says a restart loses no write (default `false`): only when every server and replica that
    /// may be promoted runs `appendfsync always`; else a restart is a loss ([`Self::lease_limit`]).
    /// [`Self::build`] then checks it (`CONFIG GET`, on every master of a cluster; replicas are
    /// yours to configure alike).
    pub fn restart_keeps_writes(mut self, keeps: bool) -> Self {
        self.config.restart_keeps_writes = keeps;
        self
    }

    /// Waits until `replicas` replicas have acknowledged an acquisition (Redis's `WAIT`, for
    /// up to `timeout`) before its holder is told it holds the lock (default: off). Applies
    /// to a lock taken directly, to one granted from the queue (the waiter first renews it,
    /// so that its own connection's WAIT covers the grant) and to a re-entry.
    ///
    /// A failover promotes a replica, and a replica that had not received a lock grants it
    /// again: with this setting, no holder is told it holds a lock that fewer than
    /// `replicas` replicas have. It costs one more round trip per acquisition (plus the
    /// replication delay). Not acknowledged in time: the acquisition is released and the
    /// caller gets [`ErrorKind::ReplicasBehind`]; a waiter stops waiting with that error too.
    /// It does not cover a failover to a replica that was not among those that acknowledged,
    /// nor the writes of later renewals.
    ///
    /// Checked by [`Self::build`]: `replicas` at least 1, `timeout` from 1 ms to half the
    /// watchdog lease, or [`ErrorKind::InvalidConfig`].
    pub fn min_replicas_acked(mut self, replicas: u32, timeout: Duration) -> Self {
        self.config.replica_ack = Some(ReplicaAck { replicas, timeout });
        self
    }

    /// Names this instance (default: none), so an operator sees where a holder runs: the
    /// name starts the instance id and every owner id (`orders-7f9c.3b1f…:12`), which
    /// `lockctl list` shows. Use what tells your instances apart (a pod or host name). 1 to
    /// 64 ASCII letters, digits, `-` or `_`; anything else is [`ErrorKind::InvalidConfig`]
    /// at [`Self::build`]. The random part stays, so two instances given one name never share
    /// an owner id.
    pub fn instance_name(mut self, name: &str) -> Self {
        self.config.instance_name = Some(name.to_owned());
        self
    }

    /// Trusts only the certificate authorities in `pem` (one or more PEM certificates) for a
    /// `rediss://` URL (default: the system's trust store): for a Redis whose certificate
    /// comes from your own CA. The server's certificate must be signed by one of them and
    /// name the URL's host. A later call replaces an earlier one. Used by the pool the client
    /// creates and by the pub/sub connection.
    ///
    /// Checked by [`Self::build`]: PEM without a usable certificate, or a URL without TLS,
    /// is [`ErrorKind::InvalidConfig`].
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.endpoint.tls.trust(pem.into());
        self
    }

    /// Presents a client certificate to a server that asks for one (mutual TLS, Redis's
    /// `tls-auth-clients`): `certificate_pem` is the certificate (optionally followed by its
    /// chain), `private_key_pem` its key, PKCS#8, PKCS#1 or SEC1 (default: no client
    /// certificate). A later call replaces an earlier one. Used by the pool the client
    /// creates and by the pub/sub connection.
    ///
    /// Checked by [`Self::build`]: an unreadable certificate or key, or a URL without TLS,
    /// is [`ErrorKind::InvalidConfig`].
    pub fn tls_client_certificate(
        mut self,
        certificate_pem: impl Into<Vec<u8>>,
        private_key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.endpoint
            .tls
            .identify(certificate_pem.into(), private_key_pem.into());
        self
    }

    /// Builds the client and starts its actors on the current Tokio runtime.
    ///
    /// The first client of a `rediss://` URL installs rustls's `ring` crypto provider as the
    /// process default, unless the application installed one before.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: the actors start when it returns, not before.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidConfig`] for an unparsable URL, a setting past the bound its
    /// method documents (the message names it), TLS
    /// certificates that cannot be read or were given for a URL without TLS, or a TLS URL
    /// that turns certificate checks off (`#insecure`), or with `restart_keeps_writes(true)` a
    /// server that does not sync every write (also `RedisUnavailable` or `AccessDenied` when it
    /// cannot be asked: a client so told connects here);
    /// [`ErrorKind::InvalidName`] for a prefix containing `{` or `}`.
    pub async fn build(self) -> Result<LockClient> {
        self.refuse_pool_and_tls()?;
        let mut config = self.config;
        config.renew_interval = self.renew_interval.unwrap_or(config.watchdog_lease / 3);
        validate_prefix(&config.prefix)?;
        config.validate()?;
        let (connections, wake_source, server) = match (&self.cluster, &self.sentinel) {
            (Some(seeds), _) => {
                let cluster = cluster_builder(seeds, config.command_timeout)
                    .build()
                    .map_err(|err| {
                        LockError::with_source(ErrorKind::InvalidConfig, "invalid cluster url", err)
                    })?;
                let connections = Connections::cluster(cluster, config.command_timeout);
                let wake_source =
                    WakeSource::Cluster(Box::new(cluster_builder(seeds, config.command_timeout)));
                (
                    connections,
                    wake_source,
                    format!("cluster {}", seeds.join(",")),
                )
            }
            (None, Some((urls, master_name))) => {
                let dialer = Dialer::sentinel(urls, master_name)?;
                let connections = Connections::sentinel(
                    dialer.clone(),
                    config.connections,
                    config.command_timeout,
                );
                (
                    connections,
                    WakeSource::Server(dialer),
                    format!("sentinel {master_name}"),
                )
            }
            (None, None) => {
                // One client for the pool and the pub/sub connection: the same credentials and
                // TLS.
                let redis_client = self.endpoint.client()?;
                let info = redis_client.get_connection_info();
                let server = format!("{}/{}", info.addr(), info.redis_settings().db());
                let url = url_of(info);
                let pool = match self.pool {
                    Some(pool) => pool,
                    None => create_pool(&redis_client, config.connections, config.command_timeout)?,
                };
                let connections =
                    Connections::new(pool, url, config.connections, config.command_timeout);
                let wake_source = WakeSource::Server(Dialer::Direct(Box::new(redis_client)));
                (connections, wake_source, server)
            }
        };
        start(config, Arc::new(connections), wake_source, server).await
    }

    /// A cluster or Sentinel client dials its own connections: a pool of the caller's or
    /// TLS certificates would be ignored, so they are refused.
    fn refuse_pool_and_tls(&self) -> Result<()> {
        let which = match (&self.cluster, &self.sentinel) {
            (Some(_), _) => "a cluster client",
            (None, Some(_)) => "a Sentinel client",
            (None, None) => return Ok(()),
        };
        if self.pool.is_some() || self.endpoint.tls.is_set() {
            return Err(LockError::new(
                ErrorKind::InvalidConfig,
                format!("{which} takes neither a pool of the caller's nor TLS certificates"),
            ));
        }
        Ok(())
    }
}

/// A client on `connections`, started once a client told that a restart loses no write has
/// seen its servers sync every write (`wire/fsync.rs`).
async fn start(
    config: Config,
    connections: Arc<Connections>,
    wake_source: WakeSource,
    server: String,
) -> Result<LockClient> {
    if config.restart_keeps_writes {
        every_write_synced(&connections).await?;
    }
    let shared = ClientState::start(config, connections, wake_source, server);
    Ok(LockClient {
        engine: Arc::new(Engine::new(shared)),
    })
}
