//! The operators' view of locks: [`LockClient::inspect`] reads what Redis holds for one lock
//! at one instant (its holders, lease, queue with each waiter's liveness, and fencing
//! counter), [`LockClient::inspect_semaphore`] the same for one semaphore (with its permits:
//! how many, held by whom, free), and [`LockClient::list`] finds the locks and semaphores
//! under the client's key prefix, a page of bounded cost at a time. `lockctl list`,
//! `inspect` and `watch` show them.

use std::time::Duration;

use crate::client::LockClient;
// The docs name the error kinds.
#[cfg(doc)]
use crate::error::ErrorKind;
use crate::error::Result;
use crate::keys::HashOf;
use crate::layout;
use crate::lock::hash_holders;
use crate::lock_kind::LockKind;
use crate::wire::snapshot::{self, RawLock};

mod list;

pub use list::{LIST_MAX_LIMIT, LIST_MAX_SCANS, LIST_SCAN_COUNT, LockPage};

/// Waiters [`LockClient::inspect`] reads, from the head of the queue.
const INSPECT_WAITERS: usize = 1000;

/// What Redis holds for one lock or semaphore, read at one instant: who holds it, for how
/// long yet, who waits behind it and whether they are still alive. From
/// [`LockClient::inspect`], [`LockClient::inspect_semaphore`] and [`LockClient::list`]; a
/// semaphore's has [`permits`](Self::permits).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockSnapshot {
    /// The lock's name.
    pub name: String,
    /// Its Redis hash (`<prefix>{<escaped name>}`; a semaphore's
    /// `<prefix>{<escaped name>}:semaphore`).
    pub key: String,
    /// How it is held: [`LockKind::Exclusive`] by an exclusive or a fair lock (they share
    /// their keys, and Redis does not tell them apart), [`LockKind::Read`] or
    /// [`LockKind::Write`] for a read-write lock, [`LockKind::Semaphore`] for a semaphore
    /// (its `permits`, and in `take` the permits all its holders hold together); `None` when
    /// nobody holds it.
    pub held_as: Option<LockKind>,
    /// Its holders: one, or each reader of a read-held lock, or each holder of a semaphore,
    /// whose own lease has not run out.
    pub holders: Vec<LockHolder>,
    /// Time left on the lock's lease (the key's PTTL: of a read-held lock, the longest
    /// reader's; of a semaphore, its longest holder's), while it is held.
    pub lease_left: Option<Duration>,
    /// The waiters at the head of its queue, first first (at most 1,000 from
    /// [`LockClient::inspect`], 16 per lock from [`LockClient::list`]).
    pub waiters: Vec<LockWaiter>,
    /// How many wait in its queue, all of them.
    pub queued: u64,
    /// The last token of the block last granted to this name from its queue, while that
    /// grant's lease lives. `None` for a lock taken free (its token went to its holder alone)
    /// and once the grant's lease ran out.
    pub fence: Option<u64>,
    /// The Redis server's clock when it was read (ms since the Unix epoch): the clock that
    /// leases and liveness run on.
    pub server_time_ms: u64,
    /// A semaphore's permits: how many it has, are held and are free. `Some` for every
    /// semaphore, held or not; `None` for a lock.
    pub permits: Option<Permits>,
    /// The last leader a singleton task of this name recorded
    /// ([`crate::guide::singleton`]); `None` for a lock no singleton took.
    pub leader: Option<Leader>,
}

/// The leader of a singleton task, in its lock's [`LockSnapshot`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// Its owner id, as [`LockHolder::owner`].
    pub owner: String,
    /// The instance it runs in, as [`LockHolder::instance`].
    pub instance: String,
    /// Its term: the fencing token of its leadership.
    pub term: u64,
    /// Since when it leads, by the server's clock (ms since the Unix epoch).
    pub since_ms: u64,
    /// Whether it still holds the lock: `false` for the last leader of a singleton nobody
    /// leads now.
    pub leading: bool,
}

impl LockSnapshot {
    /// Whether this is a semaphore's snapshot (a lock's otherwise): a lock and a semaphore
    /// of one name are two things, and [`LockClient::list`] lists both.
    pub fn is_semaphore(&self) -> bool {
        self.permits.is_some()
    }
}

/// A semaphore's permits, in its [`LockSnapshot`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Permits {
    /// How many permits the semaphore has: the count its holders asked with. 0 while nobody
    /// holds it, as Redis keeps the count only while someone does (the next acquisition's
    /// count stands).
    pub total: u32,
    /// How many its holders hold, those whose lease has not run out.
    pub used: u32,
    /// How many are free now: `total - used`. Waiters may still wait with some free, when
    /// the head of the queue wants more than that (nobody overtakes it).
    pub free: u32,
}

/// One holder of a lock, in a [`LockSnapshot`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockHolder {
    /// Its owner id: `<instance id>:<holder number>`.
    pub owner: String,
    /// The instance it runs in: the
    /// [instance name](crate::LockClientBuilder::instance_name) (`orders-7f9c`), or the first
    /// 8 hex digits of an unnamed instance's id.
    pub instance: String,
    /// Its hold count: 1 plus its re-entries (a writer's reads within its write lock
    /// included); 1 for a semaphore's holder, as every acquisition of one is an owner of
    /// its own.
    pub holds: u64,
    /// Time left on its lease: a reader's or a semaphore holder's own, anyone else's the
    /// lock's.
    pub lease_left: Option<Duration>,
    /// The permits it holds, of a semaphore; `None` for a lock's holder.
    pub permits: Option<u32>,
}

/// One owner waiting in a lock's queue, in a [`LockSnapshot`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockWaiter {
    /// Its owner id: `<instance id>:<holder number>`.
    pub owner: String,
    /// The instance it runs in, as [`LockHolder::instance`].
    pub instance: String,
    /// What it waits to take: [`LockKind::Exclusive`] (an exclusive or a fair lock),
    /// [`LockKind::Read`] or [`LockKind::Write`], or [`LockKind::Semaphore`] with the
    /// permits it asks for in `take` (and the semaphore's count in `permits`, as
    /// [`Permits::total`]).
    pub wants: LockKind,
    /// How long it has waited in the queue (server clock).
    pub waited: Duration,
    /// Whether its heartbeat still keeps its place.
    pub liveness: Liveness,
}

impl LockWaiter {
    /// Whether its liveness has not run out: a release would hand it the lock.
    pub fn is_alive(&self) -> bool {
        matches!(self.liveness, Liveness::Alive(_))
    }
}

/// A waiter's liveness: the deadline of its place in the queue, which its client's heartbeat
/// moves on each second, against the server's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Liveness {
    /// Alive, for this long yet without another heartbeat.
    Alive(Duration),
    /// Its liveness ran out this long ago (its process most likely died): the next release
    /// skips it and drops it from the queue.
    Dead(Duration),
    /// No terms recorded for it (being queued or removed at that instant).
    Unknown,
}

impl LockClient {
    /// What Redis holds for the lock `name`, read at one instant by one script that writes
    /// nothing: its holders (owner, instance, holds, lease), its queue in order with each
    /// waiter's liveness, and its fencing counter. Sees every kind of lock of the name
    /// (exclusive, fair, read-write), however it was taken, but not the semaphore of the
    /// name ([`LockClient::inspect_semaphore`]); on a cluster, reads the lock's node.
    /// [`Lock::inspect`](crate::Lock::inspect) is the shorter view.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidName`] for a name [`LockClient::lock`] refuses,
    /// [`ErrorKind::RedisUnavailable`] or [`ErrorKind::Redis`] when Redis fails,
    /// [`ErrorKind::AccessDenied`] when it refuses this client (credentials, ACL,
    /// certificate), [`ErrorKind::ShutDown`] after shutdown.
    pub async fn inspect(&self, name: &str) -> Result<LockSnapshot> {
        self.read_lock(name.to_owned(), HashOf::Lock, INSPECT_WAITERS)
            .await
    }

    /// What Redis holds for the [semaphore](crate::Semaphore) `name`, read at one instant as
    /// [`LockClient::inspect`] reads a lock: its permits ([`LockSnapshot::permits`]: how
    /// many, held, free), each holder with the permits it holds and its own lease, and its
    /// queue in order with the permits each waiter asks for. A semaphore's keys are apart
    /// from the lock's of the same name, so this never shows that lock (nor `inspect` this
    /// semaphore). It needs no permit count: it reads the one Redis holds.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    ///
    /// # Errors
    ///
    /// As [`LockClient::inspect`].
    pub async fn inspect_semaphore(&self, name: &str) -> Result<LockSnapshot> {
        self.read_lock(name.to_owned(), HashOf::Semaphore, INSPECT_WAITERS)
            .await
    }

    /// Reads the lock or semaphore `name`, and at most `max_waiters` of its queue.
    pub(super) async fn read_lock(
        &self,
        name: String,
        of: HashOf,
        max_waiters: usize,
    ) -> Result<LockSnapshot> {
        let shared = &self.engine.shared;
        let keys = of.keys(&shared.config.prefix, &name)?;
        shared.ensure_running()?;
        let read = &keys;
        let raw = shared
            .connections
            .run(keys.hash(), |mut conn| async move {
                snapshot::read(&mut conn, read, max_waiters).await
            })
            .await?;
        Ok(LockSnapshot::from_raw(
            name,
            keys.hash().to_owned(),
            of,
            raw,
        ))
    }
}

impl LockSnapshot {
    fn from_raw(name: String, key: String, of: HashOf, raw: RawLock) -> Self {
        let now = raw.server_ms;
        let lease_left = u64::try_from(raw.pttl_ms).ok().map(Duration::from_millis);
        let (held_as, holders, permits) = match of {
            HashOf::Lock => {
                let (held_as, holders) = holders_of(raw.fields, now, lease_left);
                (held_as, holders, None)
            }
            HashOf::Semaphore => {
                let (permits, holders) = semaphore_holders_of(raw.fields, now);
                let held_as = (!holders.is_empty()).then_some(LockKind::Semaphore {
                    permits: permits.total,
                    take: permits.used,
                });
                (held_as, holders, Some(permits))
            }
        };
        let leader = raw.leader.map(|(term, since_ms, owner)| Leader {
            instance: instance_of(&owner),
            leading: holders.iter().any(|holder| holder.owner == owner),
            owner,
            term,
            since_ms,
        });
        Self {
            name,
            key,
            lease_left: held_as.and(lease_left),
            held_as,
            holders,
            waiters: raw
                .waiters
                .into_iter()
                .map(|(owner, arrival_us, terms)| {
                    let mut waiter = waiter_of(owner, arrival_us, &terms, now);
                    if let Some(permits) = permits {
                        waiter.wants = LockKind::Semaphore {
                            permits: permits.total,
                            take: wanted_permits(&terms),
                        };
                    }
                    waiter
                })
                .collect(),
            queued: raw.queued,
            fence: raw.fence,
            server_time_ms: now,
            permits,
            leader,
        }
    }
}

/// How a lock is held and by whom, from its hash's fields (see `wire/lua/lib/rw.lua`): a plain
/// lock's owner with its hold count; a read-write lock's `mode`, each reader with
/// `<holds> <lease deadline ms>`, a writer's reads within its lock as `<owner>:r`. A reader
/// whose deadline passed holds nothing (the next script drops it).
fn holders_of(
    fields: Vec<(String, String)>,
    now_ms: u64,
    lease_left: Option<Duration>,
) -> (Option<LockKind>, Vec<LockHolder>) {
    let (mode, parsed) = hash_holders(fields);
    let holders: Vec<LockHolder> = parsed
        .into_iter()
        .filter_map(|holder| {
            let lease_left = match holder.deadline_ms {
                Some(deadline) if deadline <= now_ms => return None,
                Some(deadline) => Some(Duration::from_millis(deadline - now_ms)),
                None => lease_left,
            };
            Some(LockHolder {
                instance: instance_of(&holder.owner),
                owner: holder.owner,
                holds: holder.holds,
                lease_left,
                permits: None,
            })
        })
        .collect();
    let kind = match mode.as_deref() {
        Some(layout::MODE_READ) => LockKind::Read,
        Some(layout::MODE_WRITE) => LockKind::Write,
        _ => LockKind::Exclusive,
    };
    let held_as = (!holders.is_empty()).then_some(kind);
    (held_as, holders)
}

/// A semaphore's permits and holders, from its hash's fields (see `wire/lua/lib/semaphore.lua`): its
/// `permits` count, and each holder with `<permits taken> <lease deadline ms>`. A holder
/// whose deadline passed holds nothing (the next script drops it and frees its permits), so
/// the permits used are counted from the live holders, not from the hash's `used`.
fn semaphore_holders_of(fields: Vec<(String, String)>, now_ms: u64) -> (Permits, Vec<LockHolder>) {
    let total = fields
        .iter()
        .find(|(field, _)| field == layout::PERMITS)
        .and_then(|(_, count)| count.parse::<u32>().ok())
        .unwrap_or(0);
    let holders: Vec<LockHolder> = hash_holders(fields)
        .1
        .into_iter()
        .filter_map(|holder| {
            let deadline = holder.deadline_ms.filter(|deadline| *deadline > now_ms)?;
            Some(LockHolder {
                instance: instance_of(&holder.owner),
                owner: holder.owner,
                holds: 1,
                lease_left: Some(Duration::from_millis(deadline - now_ms)),
                permits: Some(u32::try_from(holder.holds).unwrap_or(u32::MAX)),
            })
        })
        .collect();
    let used = holders
        .iter()
        .filter_map(|holder| holder.permits)
        .fold(0u32, u32::saturating_add);
    let permits = Permits {
        total,
        used,
        free: total.saturating_sub(used),
    };
    (permits, holders)
}

/// The permits a semaphore's waiter asks for (see [`layout::waiter_terms`]).
fn wanted_permits(terms: &str) -> u32 {
    layout::waiter_terms(terms).take()
}

/// A queued owner, from its terms (see [`layout::waiter_terms`]).
fn waiter_of(owner: String, arrival_us: u64, terms: &str, now_ms: u64) -> LockWaiter {
    let terms = layout::waiter_terms(terms);
    let wants = match terms.role() {
        Some(layout::ROLE_READ) => LockKind::Read,
        Some(layout::ROLE_WRITE) => LockKind::Write,
        _ => LockKind::Exclusive,
    };
    let liveness = match terms.alive_until_ms {
        Some(until) if until >= now_ms => Liveness::Alive(Duration::from_millis(until - now_ms)),
        Some(until) => Liveness::Dead(Duration::from_millis(now_ms - until)),
        None => Liveness::Unknown,
    };
    LockWaiter {
        instance: instance_of(&owner),
        owner,
        wants,
        waited: Duration::from_millis(now_ms.saturating_sub(arrival_us / 1000)),
        liveness,
    }
}

/// The instance an owner id names: its instance name, or the first 8 hex digits of an
/// unnamed instance's random id.
fn instance_of(owner: &str) -> String {
    let instance = owner
        .rsplit_once(':')
        .map_or(owner, |(instance, _)| instance);
    match instance.split_once('.') {
        Some((name, _)) => name.to_owned(),
        None => instance.chars().take(8).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::tests::fields;

    const NAMED: &str = "orders-7f9c.0123456789abcdef0123456789abcdef:7";
    const UNNAMED: &str = "0123456789abcdef0123456789abcdef:12";

    #[test]
    fn instances_are_named_or_shortened() {
        assert_eq!(instance_of(NAMED), "orders-7f9c");
        assert_eq!(instance_of(UNNAMED), "01234567");
    }

    #[test]
    fn a_plain_lock_has_one_holder_with_the_lock_lease() {
        let lease = Some(Duration::from_secs(9));
        let (held, holders) = holders_of(fields(&[(NAMED, "2")]), 1_000, lease);
        assert_eq!(held, Some(LockKind::Exclusive));
        assert_eq!(holders.len(), 1);
        assert_eq!(
            (holders[0].instance.as_str(), holders[0].holds),
            ("orders-7f9c", 2)
        );
        assert_eq!(holders[0].lease_left, lease);
        assert_eq!(holders_of(Vec::new(), 1_000, None), (None, Vec::new()));
    }

    #[test]
    fn readers_have_their_own_leases_and_expired_ones_hold_nothing() {
        let read = fields(&[
            ("mode", "read"),
            ("a:1", "2 5000"),
            ("b:2", "1 900"),
            ("c:3", "1 1000"),
        ]);
        let (held, holders) = holders_of(read, 1_000, Some(Duration::from_secs(4)));
        assert_eq!(held, Some(LockKind::Read));
        assert_eq!(holders.len(), 1, "{holders:?}");
        assert_eq!(holders[0].lease_left, Some(Duration::from_millis(4_000)));
        let write = fields(&[("mode", "write"), ("a:1", "1"), ("a:1:r", "2")]);
        let (held, holders) = holders_of(write, 1_000, None);
        assert_eq!((held, holders[0].holds), (Some(LockKind::Write), 3));
    }

    #[test]
    fn a_semaphore_has_its_permits_and_each_live_holder_its_own_take_and_lease() {
        let semaphore = fields(&[
            ("permits", "5"),
            ("used", "4"),
            (NAMED, "2 4000"),
            (UNNAMED, "1 1500"),
            ("expired:3", "1 900"),
        ]);
        let (permits, holders) = semaphore_holders_of(semaphore, 1_000);
        assert_eq!(
            permits,
            Permits {
                total: 5,
                used: 3,
                free: 2
            },
            "the expired holder's permit is free"
        );
        let display_name: Vec<(&str, u64, Option<u32>, Option<Duration>)> = holders
            .iter()
            .map(|holder| {
                (
                    holder.instance.as_str(),
                    holder.holds,
                    holder.permits,
                    holder.lease_left,
                )
            })
            .collect();
        assert_eq!(
            display_name,
            [
                (
                    "orders-7f9c",
                    1,
                    Some(2),
                    Some(Duration::from_millis(3_000))
                ),
                ("01234567", 1, Some(1), Some(Duration::from_millis(500)))
            ]
        );
        let (nothing, none) = semaphore_holders_of(Vec::new(), 1_000);
        assert_eq!((nothing.total, nothing.free, none.len()), (0, 0, 0));
    }

    #[test]
    fn a_semaphore_snapshot_is_held_as_the_permits_taken_and_its_waiters_want_theirs() {
        let raw = RawLock {
            server_ms: 1_000,
            fields: fields(&[("permits", "3"), ("used", "2"), (NAMED, "2 9000")]),
            pttl_ms: 8_000,
            fence: None,
            queued: 1,
            waiters: vec![(UNNAMED.to_owned(), 500_000, "5000 3000 1 2".to_owned())],
            leader: None,
        };
        let snapshot = LockSnapshot::from_raw(
            "pool".into(),
            "lock:{pool}:semaphore".into(),
            HashOf::Semaphore,
            raw,
        );
        assert!(snapshot.is_semaphore());
        assert_eq!(
            snapshot.held_as,
            Some(LockKind::Semaphore {
                permits: 3,
                take: 2
            })
        );
        assert_eq!(snapshot.permits.map(|permits| permits.free), Some(1));
        assert_eq!(
            snapshot.waiters[0].wants,
            LockKind::Semaphore {
                permits: 3,
                take: 2
            }
        );
        assert_eq!(wanted_permits("5000 3000 1"), 1);
    }

    #[test]
    fn waiters_are_alive_or_dead_by_the_server_clock() {
        let alive = waiter_of(UNNAMED.into(), 400_000, "3000 3000 17", 1_000);
        assert_eq!(
            alive.liveness,
            Liveness::Alive(Duration::from_millis(2_000))
        );
        assert_eq!(
            (alive.wants, alive.waited),
            (LockKind::Exclusive, Duration::from_millis(600))
        );
        let dead = waiter_of(NAMED.into(), 0, "800 3000 1 w", 1_000);
        assert_eq!(dead.liveness, Liveness::Dead(Duration::from_millis(200)));
        assert!(!dead.is_alive());
        assert_eq!(dead.wants, LockKind::Write);
        let reader = waiter_of(NAMED.into(), 0, "1000 3000 1 r", 1_000);
        assert!(reader.is_alive());
        assert_eq!(reader.wants, LockKind::Read);
        assert_eq!(
            waiter_of(NAMED.into(), 0, "", 1_000).liveness,
            Liveness::Unknown
        );
    }
}
