//! The locks behind one interface, so that one worker loop drives them all: this library,
//! rslock, and the naive and bare locks written here by hand.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tower_redis_lock::layout;
use tower_redis_lock::{Lock, LockClient, LockGuard};

use crate::deployment::Deployment;
use crate::helpers::Res;
use crate::helpers::connect;
use crate::workload::Implementation;

/// Lease of the rslock and naive locks; far longer than any critical section here, so an
/// expiry never excuses an overlap.
const LEASE: Duration = Duration::from_secs(10);
/// How often a naive waiter tries `SET NX` again.
const NAIVE_POLL: Duration = Duration::from_millis(10);

/// A process's lock machinery, shared by all its workers (or one client each).
pub(crate) enum Backend {
    Ours(LockClient),
    OursPerWorker(Vec<LockClient>),
    Rslock(rslock::LockManager),
    /// The naive lock or the bare one.
    Hand(HandLock),
}

/// One worker's handle on one key.
pub(crate) enum KeyLock {
    Ours(Lock),
    Rslock {
        manager: rslock::LockManager,
        name: String,
    },
    Hand {
        lock: HandLock,
        key: Arc<str>,
    },
}

/// A held lock.
pub(crate) enum Held {
    Ours(LockGuard),
    Rslock(rslock::LockGuard),
    Hand {
        lock: HandLock,
        key: Arc<str>,
        owner: String,
    },
}

impl Backend {
    pub(crate) async fn connect(
        kind: Implementation,
        deployment: &Deployment,
        workers: usize,
    ) -> Res<Self> {
        let url = deployment.url();
        Ok(match kind {
            Implementation::Ours => Self::Ours(deployment.lock_client().await?),
            Implementation::OursPerWorker => {
                let mut clients = Vec::with_capacity(workers);
                for _ in 0..workers.max(1) {
                    clients.push(deployment.lock_client().await?);
                }
                Self::OursPerWorker(clients)
            }
            Implementation::Rslock => Self::Rslock(rslock::LockManager::new(vec![url])),
            Implementation::Naive => Self::Hand(HandLock::connect(url, false).await?),
            Implementation::Bare => Self::Hand(HandLock::connect(url, true).await?),
        })
    }

    /// How many clients this process runs: each is warmed up before the run.
    pub(crate) fn clients(&self) -> usize {
        match self {
            Self::OursPerWorker(clients) => clients.len(),
            _ => 1,
        }
    }

    /// The lock on `name` of the process's `worker`-th worker (counted from 0 in this
    /// process).
    pub(crate) fn key_lock(&self, worker: usize, name: &str) -> Res<KeyLock> {
        Ok(match self {
            Self::Ours(client) => KeyLock::Ours(client.lock(name)?),
            Self::OursPerWorker(clients) => {
                KeyLock::Ours(clients[worker % clients.len()].lock(name)?)
            }
            Self::Rslock(manager) => KeyLock::Rslock {
                manager: manager.clone(),
                name: name.to_owned(),
            },
            Self::Hand(lock) => KeyLock::Hand {
                lock: lock.clone(),
                key: name.into(),
            },
        })
    }

    /// Round trips sent so far, for the locks that count them.
    pub(crate) fn round_trips(&self) -> Option<u64> {
        match self {
            Self::Ours(client) => Some(client.round_trips()),
            Self::OursPerWorker(clients) => Some(clients.iter().map(LockClient::round_trips).sum()),
            Self::Rslock(_) => None,
            Self::Hand(lock) => Some(lock.sent.load(Ordering::Relaxed)),
        }
    }

    pub(crate) async fn shutdown(&self) {
        match self {
            Self::Ours(client) => client.shutdown().await,
            Self::OursPerWorker(clients) => {
                for client in clients {
                    client.shutdown().await;
                }
            }
            Self::Rslock(_) | Self::Hand(_) => {}
        }
    }
}

impl KeyLock {
    /// Waits until the lock is held, however long that takes.
    pub(crate) async fn acquire(&self) -> Res<Held> {
        Ok(match self {
            Self::Ours(lock) => Held::Ours(lock.acquire().await?),
            // `acquire` loops over rslock's bounded retries (3 tries, 0-200 ms apart) until
            // it gets the lock.
            Self::Rslock { manager, name } => {
                Held::Rslock(manager.acquire(name.as_str(), LEASE).await?)
            }
            Self::Hand { lock, key } => Held::Hand {
                owner: lock.acquire(key).await?,
                lock: lock.clone(),
                key: key.clone(),
            },
        })
    }
}

impl Held {
    pub(crate) async fn release(self) -> Res<()> {
        match self {
            Self::Ours(guard) => guard.release().await?,
            // Best effort by design: rslock reports nothing.
            Self::Rslock(guard) => guard.release().await,
            Self::Hand { lock, key, owner } => lock.release(&key, &owner).await?,
        }
        Ok(())
    }
}

/// A lock written by hand on one multiplexed connection per process, polled every
/// [`NAIVE_POLL`] while taken: the naive one ([`Implementation::Naive`]: `SET key owner NX PX
/// lease`, and a compare-and-delete script to release) or the bare one
/// ([`Implementation::Bare`]: [`BARE_ACQUIRE`] and [`bare_release`]).
#[derive(Clone)]
pub(crate) struct HandLock {
    conn: MultiplexedConnection,
    /// The bare lock's acquire script; the naive lock sends `SET NX` instead.
    bare_acquire: Option<Arc<redis::Script>>,
    release_script: Arc<redis::Script>,
    /// Acquire attempts and release scripts sent: this lock's round trips.
    sent: Arc<AtomicU64>,
    owner_prefix: Arc<str>,
    next_owner: Arc<AtomicU64>,
}

const NAIVE_RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
";

/// This library's free-lock acquire and nothing else: its own clock and token functions
/// (`take_free`: `HSET`, `PEXPIRE`, `TIME` and the token counter's `SET … GET`) after the
/// `LASTSAVE` its epoch marker's name ends with and one `EXISTS` over the lock, its queue, an
/// epoch key and its marker, each counted as the library counts it. KEYS: the lock, its last granted block, its queue, the epoch key, the
/// token counter, the epoch's marker; ARGV: the owner, the lease ms, the token block. The
/// keys `tokens.lua` reads are bound by the names the library's descriptions give them.
/// Returns the first token, or 0 when the lock is taken or someone queues.
const BARE_ACQUIRE: &str = concat!(
    "local LOCK, LAST_GRANT, TOKEN_COUNTER = KEYS[1], KEYS[2], KEYS[5]\n",
    include_str!("../../../src/wire/lua/lib/clock.lua"),
    include_str!("../../../src/wire/lua/lib/tokens.lua"),
    r"
last_save()
local seen = redis.call('exists', KEYS[1], KEYS[3], KEYS[4], KEYS[4], KEYS[4],
  KEYS[6], KEYS[6], KEYS[6])
if seen % 3 ~= 0 then
  return 0
end
return take_free(ARGV[1], ARGV[2], tonumber(ARGV[3]))
"
);

/// The command of this library's free-lock release: `HDEL` of the owner and the waiter marks
/// (the fields the library's data layout names).
fn bare_release() -> String {
    format!(
        "return redis.call('hdel', KEYS[1], ARGV[1], '{}', '{}') % 2",
        layout::QUEUED,
        layout::QUEUED_2
    )
}

/// The bare lock's epoch key and its marker: both exist, as they do for this library's
/// clients between restarts of Redis.
const BARE_EPOCH: [&str; 2] = ["lockbench:bare:epoch", "lockbench:bare:epoch:1:10000"];
/// The bare lock's token counter, as this library keeps one per server.
const BARE_TOKENS: &str = "lockbench:bare:tokens";
/// The token block the bare lock reserves: this library's default (one token and 16 local
/// hand-overs).
const BARE_TOKEN_BLOCK: u64 = 17;

impl HandLock {
    /// Connects and loads the scripts, so no run pays for a NOSCRIPT retry.
    async fn connect(url: &str, bare: bool) -> Res<Self> {
        let mut conn = connect(url).await?;
        let release_script = if bare {
            redis::Script::new(&bare_release())
        } else {
            redis::Script::new(NAIVE_RELEASE)
        };
        release_script
            .prepare_invoke()
            .load_async(&mut conn)
            .await?;
        let bare_acquire = if bare {
            let script = redis::Script::new(BARE_ACQUIRE);
            script.prepare_invoke().load_async(&mut conn).await?;
            for key in BARE_EPOCH {
                let () = redis::cmd("SET")
                    .arg(key)
                    .arg("1 0 10000")
                    .query_async(&mut conn)
                    .await?;
            }
            Some(Arc::new(script))
        } else {
            None
        };
        Ok(Self {
            conn,
            bare_acquire,
            release_script: Arc::new(release_script),
            sent: Arc::default(),
            owner_prefix: format!("{}:{:x}", std::process::id(), rand::random::<u64>()).into(),
            next_owner: Arc::default(),
        })
    }

    /// Tries to take the lock every [`NAIVE_POLL`] until it succeeds; returns the owner id.
    async fn acquire(&self, key: &str) -> Res<String> {
        let owner = format!(
            "{}:{}",
            self.owner_prefix,
            self.next_owner.fetch_add(1, Ordering::Relaxed)
        );
        let mut conn = self.conn.clone();
        loop {
            self.sent.fetch_add(1, Ordering::Relaxed);
            let taken = match &self.bare_acquire {
                None => {
                    let reply: redis::Value = redis::cmd("SET")
                        .arg(key)
                        .arg(&owner)
                        .arg("NX")
                        .arg("PX")
                        .arg(LEASE.as_millis() as u64)
                        .query_async(&mut conn)
                        .await?;
                    matches!(reply, redis::Value::Okay)
                }
                Some(script) => {
                    let first_token: u64 = script
                        .key(key)
                        .key(format!("{key}:fence"))
                        .key(format!("{key}:queue"))
                        .key(BARE_EPOCH[0])
                        .key(BARE_TOKENS)
                        .key(BARE_EPOCH[1])
                        .arg(&owner)
                        .arg(LEASE.as_millis() as u64)
                        .arg(BARE_TOKEN_BLOCK)
                        .invoke_async(&mut conn)
                        .await?;
                    first_token > 0
                }
            };
            if taken {
                return Ok(owner);
            }
            tokio::time::sleep(NAIVE_POLL).await;
        }
    }

    async fn release(&self, key: &str, owner: &str) -> Res<()> {
        self.sent.fetch_add(1, Ordering::Relaxed);
        let released: i64 = self
            .release_script
            .key(key)
            .arg(owner)
            .invoke_async(&mut self.conn.clone())
            .await?;
        if released != 1 {
            return Err(format!("{key}: released a lock it no longer held").into());
        }
        Ok(())
    }
}
