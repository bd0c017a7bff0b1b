//! [`LockClient::list`]: the locks and semaphores under the client's key prefix, found with
//! `SCAN` a page of bounded cost at a time, on one server or on every master of a cluster.

use futures_util::{StreamExt, TryStreamExt};

use super::LockSnapshot;
use crate::client::LockClient;
use crate::error::{ErrorKind, LockError, Result};
use crate::keys::{HashOf, hash_pattern, name_of_hash};
use crate::scopes::Placement;
use crate::wire::scan;

/// The `COUNT` of each `SCAN` that [`LockClient::list`] sends: about how many keys, of any
/// kind, Redis looks at per call.
pub const LIST_SCAN_COUNT: usize = 1000;

/// The most `SCAN` calls one [`LockClient::list`] page makes (over every master of a
/// cluster together): with [`LIST_SCAN_COUNT`], a page looks at about 100,000 keys at most,
/// however many the Redis holds. A page that stops there returns a cursor to go on from.
pub const LIST_MAX_SCANS: u32 = 100;

/// The largest `limit` of [`LockClient::list`]: locks (and semaphores) per page.
pub const LIST_MAX_LIMIT: usize = 10_000;

/// Waiters each lock of a [`LockClient::list`] page carries, from the head of its queue.
const LIST_WAITERS: usize = 16;

/// Locks of a page read at once (one script each, pipelined on the connections).
const READS_AT_ONCE: usize = 16;

/// One page of [`LockClient::list`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockPage {
    /// The locks and semaphores found, held or waited for, by name (a lock before the
    /// semaphore of the same name; [`LockSnapshot::is_semaphore`] tells them apart).
    pub locks: Vec<LockSnapshot>,
    /// Where the next page starts; `None` once every key was looked at.
    pub next_cursor: Option<String>,
    /// The `SCAN` calls this page made (at most [`LIST_MAX_SCANS`]).
    pub scans: u32,
}

impl LockClient {
    /// The locks and semaphores under this client's key prefix whose names match the glob
    /// `pattern` (`None`: every one; `*`, `?` and `[...]` as Redis's `MATCH` reads them),
    /// held or waited for, at most `limit` of them, each read as [`LockClient::inspect`] or
    /// [`LockClient::inspect_semaphore`] does (with the first 16 of its waiters). A lock and
    /// a semaphore of one name are two entries, each counted against `limit`.
    ///
    /// Locks are found with `SCAN` (never `KEYS`), on one server or on every master of a
    /// cluster: each page makes at most [`LIST_MAX_SCANS`] calls of `COUNT`
    /// [`LIST_SCAN_COUNT`], so a Redis with millions of other keys costs each page a bounded
    /// time, and the page returns a cursor (`next_cursor`) to go on from; pass it back as
    /// `cursor` (`None` starts at the beginning). As with `SCAN`, a lock that exists during
    /// the whole listing is listed at least once, and may be listed twice (across a
    /// topology change of a cluster, for one); a page may be empty while the cursor goes on.
    /// A page that ends inside one `SCAN` reply goes on, on the next page, after the last
    /// name it took from that reply: should Redis shrink its key table in between (after
    /// mass deletions), a lock of that reply could be missed.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidConfig`] for a `limit` of 0 or over [`LIST_MAX_LIMIT`], or a
    /// cursor this function did not return; [`ErrorKind::InvalidName`] for an empty
    /// pattern; and the errors of [`LockClient::inspect`].
    pub async fn list(
        &self,
        pattern: Option<&str>,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<LockPage> {
        if limit == 0 || limit > LIST_MAX_LIMIT {
            return Err(LockError::new(
                ErrorKind::InvalidConfig,
                format!("a page lists 1 to {LIST_MAX_LIMIT} locks, not {limit}"),
            ));
        }
        let pattern = pattern.unwrap_or("*");
        if pattern.is_empty() {
            return Err(LockError::new(
                ErrorKind::InvalidName,
                "the pattern is empty",
            ));
        }
        let resume = cursor.map(Cursor::parse).transpose()?;
        let shared = &self.engine.shared;
        shared.ensure_running()?;
        let prefix = shared.config.prefix.as_str();
        let connections = &shared.connections;
        let matching = hash_pattern(prefix, pattern);
        // Each master of a cluster in turn, named by a slot it serves; one server is node 0.
        let nodes = match *shared.placement {
            Placement::Single(_) => vec![0],
            Placement::Cluster { .. } => {
                connections
                    .run(
                        prefix,
                        |mut conn| async move { scan::nodes(&mut conn).await },
                    )
                    .await?
            }
        };
        let (names, next, scans) = match start(&nodes, resume) {
            Some((index, at)) => self.scan_page(&nodes, index, at, &matching, limit).await?,
            None => (Vec::new(), None, 0),
        };
        let mut locks: Vec<LockSnapshot> = futures_util::stream::iter(names)
            .filter_map(|(name, of)| async move {
                // A name too long for a lock is none (a key someone else wrote): skipped.
                of.keys(prefix, &name).ok()?;
                Some(self.read_lock(name, of, LIST_WAITERS))
            })
            .buffered(READS_AT_ONCE)
            .try_filter(|lock| std::future::ready(!lock.holders.is_empty() || lock.queued > 0))
            .try_collect()
            .await?;
        locks.sort_by(|a, b| (&a.name, a.is_semaphore()).cmp(&(&b.name, b.is_semaphore())));
        Ok(LockPage {
            locks,
            next_cursor: next.map(|at| at.to_string()),
            scans,
        })
    }

    /// Scans from `at` on `nodes[index]` on, for at most `limit` names of locks or
    /// semaphores: the names (each once) with what they name, where the next page starts,
    /// and the SCAN calls made.
    async fn scan_page(
        &self,
        nodes: &[u16],
        mut index: usize,
        mut at: Cursor,
        matching: &str,
        limit: usize,
    ) -> Result<(Vec<(String, HashOf)>, Option<Cursor>, u32)> {
        let shared = &self.engine.shared;
        let prefix = shared.config.prefix.as_str();
        let mut names = Vec::new();
        let mut scans = 0;
        loop {
            if scans == LIST_MAX_SCANS {
                return Ok((names, Some(at), scans));
            }
            let (next, keys) = shared
                .connections
                .run(prefix, |mut conn| async move {
                    scan::scan_hashes(&mut conn, at.node, at.scan, matching, LIST_SCAN_COUNT).await
                })
                .await?;
            scans += 1;
            // In a stable order, so that a page cut inside one reply goes on after the last
            // name it took when that reply is asked for again.
            let mut batch: Vec<(u64, String, HashOf)> = keys
                .iter()
                .filter_map(|key| {
                    let (name, of) = name_of_hash(prefix, key)?;
                    Some((resume_hash(entry_of(&name, of, key)), name, of))
                })
                .filter(|(hash, ..)| at.after.is_none_or(|after| *hash > after))
                .collect();
            batch.sort_unstable();
            batch.dedup();
            let room = limit - names.len();
            if batch.len() > room {
                let after = batch[room - 1].0;
                names.extend(batch.into_iter().take(room).map(|(_, name, of)| (name, of)));
                return Ok((
                    names,
                    Some(Cursor {
                        after: Some(after),
                        ..at
                    }),
                    scans,
                ));
            }
            names.extend(batch.into_iter().map(|(_, name, of)| (name, of)));
            at = if next != 0 {
                Cursor {
                    scan: next,
                    ..Cursor::start_of(at.node)
                }
            } else if let Some(node) = nodes.get(index + 1) {
                index += 1;
                Cursor::start_of(*node)
            } else {
                return Ok((names, None, scans));
            };
            if names.len() == limit {
                return Ok((names, Some(at), scans));
            }
        }
    }
}

/// Where a page of [`LockClient::list`] starts: a node (a slot its master serves; 0 on one
/// server), a SCAN cursor on it, and, for a page cut inside one SCAN reply, the
/// [`resume_hash`] of the last name taken from it. Written `<node>:<scan>[:<after hex>]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cursor {
    node: u16,
    scan: u64,
    after: Option<u64>,
}

impl Cursor {
    /// The start of `node`.
    fn start_of(node: u16) -> Self {
        Self {
            node,
            scan: 0,
            after: None,
        }
    }

    fn parse(text: &str) -> Result<Self> {
        let invalid = || {
            LockError::new(
                ErrorKind::InvalidConfig,
                format!("{text:?} is not a cursor that a page of locks returned"),
            )
        };
        let mut parts = text.split(':');
        let node = parts.next().and_then(|node| node.parse().ok());
        let scan = parts.next().and_then(|scan| scan.parse().ok());
        let after = match parts.next() {
            None => None,
            Some(after) => Some(u64::from_str_radix(after, 16).map_err(|_| invalid())?),
        };
        match (node, scan, parts.next()) {
            (Some(node), Some(scan), None) => Ok(Self { node, scan, after }),
            _ => Err(invalid()),
        }
    }
}

impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.node, self.scan)?;
        match self.after {
            Some(after) => write!(f, ":{after:016x}"),
            None => Ok(()),
        }
    }
}

/// Where a page starts among `nodes`: at the first node and its start, or where `resume`
/// says (from the start of the next node on, should that node be gone since); `None` when
/// no node is left.
fn start(nodes: &[u16], resume: Option<Cursor>) -> Option<(usize, Cursor)> {
    let Some(resume) = resume else {
        return Some((0, Cursor::start_of(*nodes.first()?)));
    };
    let index = nodes.iter().position(|node| *node >= resume.node)?;
    if nodes[index] == resume.node {
        return Some((index, resume));
    }
    Some((index, Cursor::start_of(nodes[index])))
}

/// What [`resume_hash`] hashes for a lock or semaphore found as `key`: a lock's name, a
/// semaphore's whole key (so that the lock and the semaphore of one name differ).
fn entry_of<'a>(name: &'a str, of: HashOf, key: &'a str) -> &'a str {
    match of {
        HashOf::Lock => name,
        HashOf::Semaphore => key,
    }
}

/// FNV-1a of an entry (see [`entry_of`]): the order of names within one SCAN reply, so that
/// a page cut inside it can go on after the last name it took (two entries of one reply
/// with the same 64-bit hash are the one case this could skip).
fn resume_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_strangers_are_refused() {
        for cursor in [
            Cursor {
                node: 0,
                scan: 0,
                after: None,
            },
            Cursor {
                node: 5461,
                scan: 123_456,
                after: Some(u64::MAX),
            },
        ] {
            assert_eq!(Cursor::parse(&cursor.to_string()).unwrap(), cursor);
        }
        for bad in ["", "x", "1", "1:2:zz", "1:2:3:4", "-1:0"] {
            let err = Cursor::parse(bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{bad}");
        }
    }

    #[test]
    fn a_page_starts_at_its_node_or_the_next_one_left() {
        let nodes = [0, 5461, 10923];
        let at = |node, scan| Cursor {
            node,
            scan,
            after: None,
        };
        assert_eq!(start(&nodes, None), Some((0, at(0, 0))));
        assert_eq!(start(&nodes, Some(at(5461, 9))), Some((1, at(5461, 9))));
        // That master is gone: the next one, from its start.
        assert_eq!(start(&nodes, Some(at(6000, 9))), Some((2, at(10923, 0))));
        assert_eq!(start(&nodes, Some(at(12000, 9))), None);
        assert_eq!(start(&[], None), None);
    }
}
