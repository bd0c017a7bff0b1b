//! `RedLock`: one name on N independent Redis servers, held while a majority holds it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::Instant;

use super::parts::{Parts, give_up};
use crate::client::LockClient;
use crate::error::{ErrorKind, LockError, Result};
use crate::guard::{LockGuard, LostSignal};
use crate::keys::display_name;
use crate::lease::Lease;
use crate::lock::Lock;
use crate::meter::{counted, counted_try};

/// The least per-server bound of one attempt (see [`RedLock::attempt_timeout`]): the
/// default bound is 1 % of the lease, but never less than this, so a cold connection (a
/// TCP or TLS handshake, loading the scripts) still answers in time.
pub const REDLOCK_MIN_ATTEMPT_TIMEOUT: Duration = Duration::from_millis(50);

/// Default for [`RedLock::retry_delay`]: a waiting acquire that failed to reach a quorum
/// waits a random delay between half of this and all of it (100 to 200 ms) before it tries
/// again, so competitors that collided do not collide again in step.
pub const DEFAULT_REDLOCK_RETRY_DELAY: Duration = Duration::from_millis(200);

/// Fixed part of the clock drift allowed for (the Redlock algorithm's 2 ms); the rest is
/// 1 % of the lease.
const DRIFT_FLOOR: Duration = Duration::from_millis(2);

/// A quorum lock: the same name locked on N independent Redis servers (the Redlock
/// algorithm), held while a majority (N/2 + 1) of them hold it. For users who do not want a
/// single Redis (its restart, its failover) to be able to let two holders in.
///
/// **Acquiring.** One attempt asks every server at once (a plain [`Lock::try_acquire`] of
/// the name, in parallel), each bounded by [`RedLock::attempt_timeout`]. It succeeds when a
/// quorum granted the lock AND time is left on it: the validity is the lease minus the time
/// the attempt took minus the clock drift allowed for (1 % of the lease plus 2 ms, as in the
/// Redlock algorithm). Otherwise every part is released at once, including on servers whose
/// answer came too late (their grant is undone by the engine as soon as it lands), and a
/// waiting acquire tries again after a random back-off ([`DEFAULT_REDLOCK_RETRY_DELAY`]).
///
/// **Holding.** With [`Lease::Watchdog`] (the default) each client's watchdog renews its own
/// part; with [`Lease::Fixed`] nothing is renewed and the lock ends with the lease. The
/// guard's lost signal fires as soon as fewer than a quorum of parts are still held (a part
/// lost, its server unreachable past the lease): from then on, another holder may get a
/// quorum.
///
/// **Fencing.** Each server counts its own fencing tokens: there is no single sequence
/// across independent servers, so [`RedLockGuard::fencing_tokens`] gives one per server.
///
/// **Limits.** The safety of Redlock rests on bounded clock drift and on servers that keep
/// their data (or stay down longer than a lease after a restart); see
/// [`crate::guide::safety`]. Fencing tokens remain the way to make a stale holder harmless.
///
/// ```no_run
/// # async fn demo(urls: [&str; 5]) -> Result<(), tower_redis_lock::LockError> {
/// use std::time::Duration;
/// use tower_redis_lock::{LockClient, RedLock};
///
/// let mut clients = Vec::new();
/// for url in urls {
///     clients.push(LockClient::connect(url).await?);
/// }
/// let lock = RedLock::new(clients, "ledger")?;
/// let guard = lock.acquire_timeout(Duration::from_secs(10)).await?;
/// assert!(guard.held_on() >= lock.quorum());
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedLock {
    name: Arc<str>,
    /// The name's lock on each server, in the order the clients were given.
    locks: Vec<Lock>,
    attempt_timeout: Option<Duration>,
    retry_delay: Duration,
}

impl fmt::Debug for RedLock {
    /// The servers rather than every client's internals.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let servers: Vec<&str> = self
            .locks
            .iter()
            .map(|lock| lock.client().server())
            .collect();
        f.debug_struct("RedLock")
            .field("name", &self.name)
            .field("servers", &servers)
            .field("attempt_timeout", &self.attempt_timeout)
            .field("retry_delay", &self.retry_delay)
            .finish()
    }
}

impl RedLock {
    /// The quorum lock `name` on the servers of `clients`, one client per independent
    /// Redis server.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidConfig`] when `clients` is empty or two clients talk to the same
    /// server ([`LockClient::server`], whatever the database: one server's failure would
    /// count twice), and [`ErrorKind::InvalidName`] for a bad name.
    pub fn new(clients: Vec<LockClient>, name: &str) -> Result<Self> {
        if clients.is_empty() {
            return Err(LockError::new(
                ErrorKind::InvalidConfig,
                "a RedLock needs at least one server",
            ));
        }
        let mut seen = Vec::with_capacity(clients.len());
        for client in &clients {
            let address = server_address(client);
            if seen.contains(&address) {
                return Err(LockError::new(
                    ErrorKind::InvalidConfig,
                    format!("the RedLock names the server {address} twice"),
                ));
            }
            seen.push(address);
        }
        let locks = clients
            .iter()
            .map(|client| client.lock(name))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            name: name.into(),
            locks,
            attempt_timeout: None,
            retry_delay: DEFAULT_REDLOCK_RETRY_DELAY,
        })
    }

    /// The same lock, acquired with `lease` on every server (default [`Lease::Watchdog`]:
    /// each client's watchdog lease, renewed by that client).
    #[must_use]
    pub fn with_lease(mut self, lease: Lease) -> Self {
        self.locks = self
            .locks
            .into_iter()
            .map(|lock| lock.with_lease(lease))
            .collect();
        self
    }

    /// Bound on each server's answer within one attempt (default: 1 % of the lease, at least
    /// [`REDLOCK_MIN_ATTEMPT_TIMEOUT`], 50 ms; 300 ms for the default 30 s watchdog lease).
    /// A server that does not answer in time counts as unreachable for that attempt; keep
    /// the bound small next to the lease, since the attempt's time comes off the validity.
    #[must_use]
    pub fn attempt_timeout(mut self, bound: Duration) -> Self {
        self.attempt_timeout = Some(bound.max(Duration::from_millis(1)));
        self
    }

    /// Base of the random back-off between attempts of a waiting acquire (default
    /// [`DEFAULT_REDLOCK_RETRY_DELAY`], 200 ms): each pause is drawn between half of it and
    /// all of it. At least 1 ms.
    #[must_use]
    pub fn retry_delay(mut self, delay: Duration) -> Self {
        self.retry_delay = delay.max(Duration::from_millis(1));
        self
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many servers the lock is spread over (N).
    pub fn servers(&self) -> usize {
        self.locks.len()
    }

    /// How many servers must hold the lock: N/2 + 1.
    pub fn quorum(&self) -> usize {
        self.locks.len() / 2 + 1
    }

    /// The name's plain lock on each server, in the order the clients were given (for
    /// inspection: [`Lock::is_locked`], [`Lock::inspect`]).
    pub fn locks(&self) -> &[Lock] {
        &self.locks
    }

    /// The shortest lease of the parts: the lease the validity is counted from.
    fn lease(&self) -> Duration {
        self.locks
            .iter()
            .map(Lock::lease_length)
            .min()
            .expect("a RedLock has at least one server")
    }

    fn attempt_bound(&self, lease: Duration) -> Duration {
        self.attempt_timeout
            .unwrap_or_else(|| (lease / 100).max(REDLOCK_MIN_ATTEMPT_TIMEOUT))
    }

    /// Waits until a quorum holds the lock, however long that takes, trying again after a
    /// random back-off while others hold it. Cancel by dropping the future: every part
    /// taken is released.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future releases what it took (in the background) and leaves no
    /// place queued or subscribed.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidConfig`] for a fixed lease too short to outlast the allowed clock
    /// drift (about 2 ms);
    /// [`ErrorKind::QuorumUnreachable`] as soon as one attempt finds so many servers
    /// unreachable (or silent past the attempt bound) that the others cannot make a quorum;
    /// a server's own error ([`ErrorKind::AccessDenied`], [`ErrorKind::Redis`],
    /// [`ErrorKind::ShutDown`]) when such errors, with the unreachable servers, leave too
    /// few servers for a quorum. Errors on fewer servers only cost those servers' votes.
    pub async fn acquire(&self) -> Result<RedLockGuard> {
        counted("redlock", self.acquire_until(None)).await
    }

    /// Waits at most `wait` for a quorum. An attempt under way when `wait` runs out is let
    /// finish, so this returns at most one attempt bound (plus the release of its parts)
    /// after `wait`.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future releases what it took (in the background) and leaves no
    /// place queued or subscribed.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Timeout`] when the servers answer but others keep the lock past `wait`,
    /// and the errors of [`RedLock::acquire`].
    pub async fn acquire_timeout(&self, wait: Duration) -> Result<RedLockGuard> {
        let bounded = self.acquire_until(Some((Instant::now() + wait, wait)));
        counted("redlock", bounded).await
    }

    /// One attempt: the lock if a quorum grants it now, `Ok(None)` (holding nothing) when
    /// the servers answer but too few grant it.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future releases what it took (in the background) and leaves no
    /// place queued or subscribed.
    ///
    /// # Errors
    ///
    /// As [`RedLock::acquire`].
    pub async fn try_acquire(&self) -> Result<Option<RedLockGuard>> {
        counted_try("redlock", self.attempt()).await
    }

    async fn acquire_until(&self, deadline: Option<(Instant, Duration)>) -> Result<RedLockGuard> {
        loop {
            if let Some(guard) = self.attempt().await? {
                return Ok(guard);
            }
            let mut pause = self.backoff();
            if let Some((deadline, wait)) = deadline {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(LockError::timeout(&format!(
                        "no quorum for '{}' within {wait:?}",
                        display_name(&self.name)
                    )));
                }
                // One last attempt right at the deadline rather than none.
                pause = pause.min(left);
            }
            tokio::time::sleep(pause).await;
        }
    }

    fn backoff(&self) -> Duration {
        let half = self.retry_delay / 2;
        half + half.mul_f64(rand::random::<f64>())
    }

    /// Asks every server at once; keeps the parts if a quorum granted the lock with time left
    /// on it, or else releases them all.
    async fn attempt(&self) -> Result<Option<RedLockGuard>> {
        let lease = self.lease();
        if lease <= drift(lease) {
            return Err(LockError::new(
                ErrorKind::InvalidConfig,
                format!("a lease of {lease:?} leaves no validity after the clock drift"),
            ));
        }
        let bound = self.attempt_bound(lease);
        let started = Instant::now();
        let replies = join_all(self.locks.iter().map(|lock| async move {
            match tokio::time::timeout(bound, lock.try_acquire_part()).await {
                Ok(reply) => reply,
                // Dropping the try undoes a grant that lands later.
                Err(_) => Err(LockError::new(
                    ErrorKind::RedisUnavailable,
                    format!("no answer within the attempt bound of {bound:?}"),
                )),
            }
        }))
        .await;
        let validity = started + lease.saturating_sub(drift(lease));

        let mut servers = Vec::new();
        let mut guards = Vec::new();
        let mut unreachable = Vec::new();
        let mut refused = Vec::new();
        for (server, reply) in replies.into_iter().enumerate() {
            match reply {
                Ok(Some(guard)) => {
                    servers.push(server);
                    guards.push(guard);
                }
                Ok(None) => {}
                Err(err) if err.kind() == ErrorKind::RedisUnavailable => unreachable.push(err),
                Err(err) => refused.push(err),
            }
        }
        if guards.len() >= self.quorum() && Instant::now() < validity {
            tracing::debug!(
                lock = %display_name(&self.name),
                held_on = guards.len(),
                servers = self.servers(),
                "quorum lock acquired"
            );
            return Ok(Some(RedLockGuard {
                name: self.name.clone(),
                servers,
                server_count: self.servers(),
                parts: Parts::new(guards, self.quorum()),
                validity: validity.into_std(),
            }));
        }
        give_up(guards).await;
        // Servers the quorum can do without; more failures than this and no quorum is possible.
        let spare = self.servers() - self.quorum();
        if unreachable.len() > spare {
            return Err(LockError::new(
                ErrorKind::QuorumUnreachable,
                format!(
                    "'{}': {} of {} servers unreachable, a quorum needs {} ({})",
                    self.name,
                    unreachable.len(),
                    self.servers(),
                    self.quorum(),
                    unreachable[0]
                ),
            ));
        }
        if unreachable.len() + refused.len() > spare {
            return Err(refused.swap_remove(0));
        }
        for err in &refused {
            tracing::warn!(lock = %display_name(&self.name), error = %err, "a quorum server refused the lock");
        }
        Ok(None)
    }
}

/// The clock drift a quorum lock allows for: 1 % of the lease plus 2 ms (Redlock).
fn drift(lease: Duration) -> Duration {
    lease / 100 + DRIFT_FLOOR
}

/// The server part of [`LockClient::server`], without the database.
fn server_address(client: &LockClient) -> &str {
    let server = client.server();
    server
        .rsplit_once('/')
        .map_or(server, |(address, _db)| address)
}

/// Proof of holding a [`RedLock`] on a quorum of its servers. Release it with
/// [`RedLockGuard::release`] to see the result; dropping it releases every part in the
/// background.
#[derive(Debug)]
#[must_use = "dropping the guard releases the lock at once"]
pub struct RedLockGuard {
    name: Arc<str>,
    /// The index (in the clients given to [`RedLock::new`]) of each part's server.
    servers: Vec<usize>,
    server_count: usize,
    parts: Parts,
    validity: std::time::Instant,
}

impl RedLockGuard {
    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Until when the quorum acquisition is valid if no part is ever renewed: the start of
    /// the attempt plus the lease minus the allowed clock drift. A watchdog lease is renewed
    /// past it; watch [`RedLockGuard::lost_signal`] for the end of a quorum.
    pub fn validity(&self) -> std::time::Instant {
        self.validity
    }

    /// On how many servers the lock is still held, as far as this process knows (at least
    /// the quorum at acquisition).
    pub fn held_on(&self) -> usize {
        self.parts.held()
    }

    /// The fencing token of each server, by the position of its client in
    /// [`RedLock::new`]; `None` where this guard holds no part. Independent servers count
    /// separately, so these are N sequences, not one: hand the resource the token of a
    /// server it trusts, or all of them.
    pub fn fencing_tokens(&self) -> Vec<Option<u64>> {
        let mut tokens = vec![None; self.server_count];
        for (server, guard) in self.servers.iter().zip(self.parts.guards()) {
            tokens[*server] = Some(guard.fencing_token());
        }
        tokens
    }

    /// A signal that fires as soon as fewer than a quorum of parts are held, with the
    /// reason of the part whose loss broke the quorum.
    pub fn lost_signal(&self) -> LostSignal {
        self.parts.lost_signal()
    }

    /// Whether a quorum of parts is still held, as far as this process knows.
    pub fn is_held(&self) -> bool {
        self.parts.is_held()
    }

    /// Releases the lock on every server that holds a part (in parallel) and waits for each.
    ///
    /// # Cancel safety
    ///
    /// Cancelling the call leaves the release to finish in the background, as a dropped guard's
    /// does.
    ///
    /// # Errors
    ///
    /// The first error of [`LockGuard::release`] (a server down answers
    /// [`ErrorKind::RedisUnavailable`]; its part then runs out with its lease); every other
    /// part is released all the same.
    pub async fn release(self) -> Result<()> {
        self.parts.release().await
    }

    /// The guard of each part held, in the order of the clients given to [`RedLock::new`].
    pub fn guards(&self) -> &[LockGuard] {
        self.parts.guards()
    }
}
