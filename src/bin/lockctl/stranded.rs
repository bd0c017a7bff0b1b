//! `lockctl stranded`: the library's keys left on a master that does not own their slot.
//!
//! An operator who aborts a slot migration (`CLUSTER SETSLOT <slot> STABLE` on both nodes)
//! after some keys were moved leaves those keys on the importing node, which never owned the
//! slot: every client is sent away from it (`MOVED`), a key without a TTL (a slot's epoch)
//! stays there for ever, `redis-cli --cluster check` reports nothing, and every later
//! migration of the slot to that node fails with `BUSYKEY`. The owner's state is the one that
//! counts; the stranded copy is only in the way.
//!
//! The library's client never sees a cluster node this way, so this command works on raw
//! connections of its own, one per master, made with the seed URL's credentials and TLS.

use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;

use redis::aio::MultiplexedConnection;
use redis::{ConnectionInfo, IntoConnectionInfo, RedisError, RedisResult};
use serde_json::json;
use tower_redis_lock::{DEFAULT_PREFIX, LockClient, LockError, LockKeys};

use crate::nodes::{NodeLine, SLOTS, client_for, cluster_nodes, connect, myself, parse_nodes};
use crate::operate::confirmed;
use crate::out::emit;
use crate::out::sayln;
use crate::servers::{Settings, Topology};

/// What `lockctl stranded` is asked: whether to delete what it finds, without asking
/// (`--yes`), and whether to print JSON.
pub(crate) struct Stranded {
    pub(crate) delete: bool,
    pub(crate) yes: bool,
    pub(crate) json: bool,
}

/// Commands in one pipeline: short enough that no reply waits long behind the others.
const PIPELINE: usize = 1000;

/// One master of the cluster, as the seed lists it, and its connection and its own view of
/// itself (its line in its own `CLUSTER NODES`: only there does a node show the slots it has
/// open) once it answered.
struct Master {
    line: NodeLine,
    reached: Result<(MultiplexedConnection, NodeLine), RedisError>,
}

impl Master {
    fn own(&self) -> Option<&NodeLine> {
        self.reached.as_ref().ok().map(|(_, own)| own)
    }
}

/// The keys under the prefix that one master holds in one slot it does not own, and what is
/// to be done with them.
struct Found {
    master: usize,
    slot: u16,
    keys: Vec<Vec<u8>>,
    verdict: Verdict,
}

enum Verdict {
    /// Stranded: the slot is stable and owned by this other master (an index of `masters`).
    Stranded(usize),
    /// Not stranded, or not surely: why.
    Skipped(&'static str),
}

/// `lockctl stranded [--delete] [--json]`: lists (and with `--delete` removes) the keys
/// under the prefix on a master that does not own their slot while that slot is stable.
/// Keys of a slot some node has open (`MIGRATING`/`IMPORTING`) belong to a migration under
/// way, and are only mentioned as skipped. A single server (or Sentinel's master) owns every
/// key: nothing to check.
pub(crate) async fn run(
    urls: &[String],
    topology: &Topology,
    settings: &Settings,
    ask: &Stranded,
) -> Result<ExitCode, LockError> {
    let prefix = settings.prefix.as_deref().unwrap_or(DEFAULT_PREFIX);
    // The library's own check of a prefix (no brace: it would break every key's hash tag).
    LockKeys::new(prefix, "-")?;
    let seed = match topology {
        Topology::Sentinel(_) => None,
        Topology::Servers | Topology::Cluster => cluster_seed(urls, settings).await?,
    };
    let Some(seed) = seed else {
        if ask.json {
            emit(json!({
                "event": "summary",
                "cluster": false,
                "stranded": 0,
                "skipped": 0,
                "deleted": ask.delete.then_some(0),
            }));
        } else {
            sayln!(
                "not a Redis Cluster: one server owns every key, so none is stranded; \
                 nothing to check"
            );
        }
        return Ok(ExitCode::SUCCESS);
    };
    let seed_info = seed.as_str().into_connection_info()?;
    let mut seed_conn = connect(client_for(&seed_info, None, settings)?).await?;
    let view = parse_nodes(&cluster_nodes(&mut seed_conn).await?)?;
    let mut masters = Vec::new();
    for line in view.into_iter().filter(NodeLine::is_reachable_master) {
        let reached = reach(&seed_info, &line, settings).await;
        masters.push(Master { line, reached });
    }
    masters.sort_by_key(|master| master.line.address());
    let mut failed = false;
    for master in &masters {
        if let Err(err) = &master.reached {
            failed = true;
            unchecked(&master.line, &err.to_string(), ask.json);
        }
    }
    let (found, others, unread) = find(&mut masters, prefix, ask.json).await;
    failed |= unread > 0;
    let (mut stranded, mut skipped) = (0, 0);
    for place in &found {
        let node = masters[place.master].line.address();
        match place.verdict {
            Verdict::Stranded(owner) => {
                stranded += place.keys.len();
                let owner = masters[owner].line.address();
                for key in &place.keys {
                    show_stranded(&node, place.slot, key, &owner, ask.json);
                }
            }
            Verdict::Skipped(why) => {
                skipped += place.keys.len();
                show_skipped(&node, place, why, ask.json);
            }
        }
    }
    let checked = masters.iter().filter(|m| m.reached.is_ok()).count() - unread;
    let mut deleted = None;
    if ask.delete && stranded > 0 {
        if !ask.yes {
            eprintln!(
                "{} on {} master(s), listed above: the owner of each slot keeps its own",
                plural(stranded, "stranded key"),
                distinct_masters(&found)
            );
            if !confirmed(&format!("delete {}?", plural(stranded, "stranded key"))) {
                eprintln!("nothing deleted");
                return Ok(ExitCode::from(1));
            }
        }
        let (count, all_done) = delete(&mut masters, &found, ask.json).await;
        failed |= !all_done;
        deleted = Some(count);
    }
    if ask.json {
        emit(json!({
            "event": "summary",
            "cluster": true,
            "masters": masters.len(),
            "checked": checked,
            "stranded": stranded,
            "skipped": skipped,
            "deleted": deleted,
            "others": others,
        }));
    } else {
        let mut summary = format!(
            "{}, {skipped} skipped, {checked} of {} checked",
            plural(stranded, "stranded key"),
            plural(masters.len(), "master")
        );
        if let Some(count) = deleted {
            summary.push_str(&format!("; deleted {count} of {stranded}"));
        }
        if others > 0 {
            summary.push_str(&format!(
                "; {} of those slots not under {prefix} left alone",
                plural(others, "other key")
            ));
        }
        sayln!("{summary}");
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// The first seed that answers, when it is a node of a cluster; `None` when it is one server.
/// Each seed is asked the library's way (`INFO cluster` over a connection made with the
/// builder's credentials and TLS), so a URL or TLS setting the library refuses is refused
/// here the same way, at once; a seed that does not answer passes to the next.
async fn cluster_seed(urls: &[String], settings: &Settings) -> Result<Option<String>, LockError> {
    let mut last = None;
    for url in urls {
        match settings
            .apply(LockClient::builder(url))
            .points_to_cluster_node()
            .await
        {
            Ok(true) => return Ok(Some(url.clone())),
            Ok(false) => return Ok(None),
            Err(err) if err.kind() == tower_redis_lock::ErrorKind::InvalidConfig => {
                return Err(err);
            }
            Err(err) => last = Some(err),
        }
    }
    Err(last.expect("at least one URL"))
}

/// A connection to `line`'s master and its own line of its own view.
async fn reach(
    seed: &ConnectionInfo,
    line: &NodeLine,
    settings: &Settings,
) -> Result<(MultiplexedConnection, NodeLine), RedisError> {
    let mut conn = connect(client_for(seed, Some((line.host(), line.port)), settings)?).await?;
    let own = myself(&cluster_nodes(&mut conn).await?)?;
    Ok((conn, own))
}

/// Every master's keys under `prefix` in slots it does not own (its own view), with what to
/// do with them; how many other keys those slots hold there; and how many masters that
/// answered could not be read after all (each is reported).
async fn find(masters: &mut [Master], prefix: &str, json: bool) -> (Vec<Found>, usize, usize) {
    // A slot is open when any node shows it MIGRATING or IMPORTING on its own line.
    let open: BTreeSet<u16> = masters
        .iter()
        .filter_map(Master::own)
        .flat_map(|own| own.open.iter().copied())
        .collect();
    let (mut found, mut others, mut unread) = (Vec::new(), 0, 0);
    for index in 0..masters.len() {
        let Ok((conn, own)) = &mut masters[index].reached else {
            continue;
        };
        let foreign: Vec<u16> = (0..SLOTS).filter(|slot| !own.serves(*slot)).collect();
        let held = match keys_in(conn, &foreign).await {
            Ok(held) => held,
            Err(err) => {
                unread += 1;
                unchecked(&masters[index].line, &err.to_string(), json);
                continue;
            }
        };
        for (slot, keys) in held {
            let (ours, theirs): (Vec<Vec<u8>>, Vec<Vec<u8>>) = keys
                .into_iter()
                .partition(|key| key.starts_with(prefix.as_bytes()));
            if ours.is_empty() {
                continue;
            }
            others += theirs.len();
            found.push(Found {
                master: index,
                slot,
                keys: ours,
                verdict: verdict(masters, index, slot, &open),
            });
        }
    }
    (found, others, unread)
}

/// Whether the keys master `index` holds in `slot` (which it does not own) are stranded: the
/// slot open nowhere, and one other master owns it, as the seed and that master both say.
fn verdict(masters: &[Master], index: usize, slot: u16, open: &BTreeSet<u16>) -> Verdict {
    if open.contains(&slot) {
        return Verdict::Skipped("the slot migrates (IMPORTING or MIGRATING on a node)");
    }
    let owners: Vec<usize> = (0..masters.len())
        .filter(|owner| masters[*owner].line.serves(slot))
        .collect();
    let owner = match owners.as_slice() {
        [] => return Verdict::Skipped("no master serves the slot"),
        [owner] => *owner,
        _ => return Verdict::Skipped("several masters claim the slot"),
    };
    if owner == index {
        return Verdict::Skipped("the node's view of the slot is not the cluster's yet");
    }
    match masters[owner].own() {
        None => Verdict::Skipped("the slot's owner did not answer"),
        Some(own) if !own.serves(slot) => {
            Verdict::Skipped("the slot's owner does not say it owns it yet")
        }
        Some(_) => Verdict::Stranded(owner),
    }
}

/// The keys the node holds in each of `slots` that has any (`COUNTKEYSINSLOT`, then
/// `GETKEYSINSLOT` for those): a node's cost, however many keys its own slots hold, is that
/// of one counter per slot, where a `SCAN` would walk every key.
async fn keys_in(
    conn: &mut MultiplexedConnection,
    slots: &[u16],
) -> RedisResult<BTreeMap<u16, Vec<Vec<u8>>>> {
    let mut counted = Vec::new();
    for chunk in slots.chunks(PIPELINE) {
        let mut pipe = redis::pipe();
        for slot in chunk {
            pipe.cmd("CLUSTER").arg("COUNTKEYSINSLOT").arg(*slot);
        }
        let counts: Vec<u64> = pipe.query_async(conn).await?;
        counted.extend(chunk.iter().copied().zip(counts).filter(|(_, n)| *n > 0));
    }
    let mut held = BTreeMap::new();
    for chunk in counted.chunks(PIPELINE) {
        let mut pipe = redis::pipe();
        for (slot, count) in chunk {
            pipe.cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(*slot)
                .arg(*count);
        }
        let keys: Vec<Vec<Vec<u8>>> = pipe.query_async(conn).await?;
        for ((slot, _), mut keys) in chunk.iter().zip(keys) {
            keys.sort();
            held.insert(*slot, keys);
        }
    }
    Ok(held)
}

/// Deletes the stranded keys of each slot; how many went, and whether every slot was done.
///
/// A node refuses `DEL` of a key of a slot it does not own (`MOVED`), but serves one after
/// `ASKING` while it imports the slot: so for each slot, `CLUSTER SETSLOT <slot> IMPORTING
/// <owner>` on the stranded node, `ASKING` + `DEL` of each key, then `SETSLOT <slot> STABLE`,
/// restored whatever the deletions did. Each `DEL` names one key: a node that imports a slot
/// refuses a command of several keys (`TRYAGAIN`) when one of them is missing (one expired
/// meanwhile). Both nodes are asked again first, so a slot that began to migrate or changed
/// hands since the listing is left alone; no other node is ever changed.
async fn delete(masters: &mut [Master], found: &[Found], json: bool) -> (usize, bool) {
    let (mut deleted, mut all_done) = (0, true);
    for place in found {
        let Verdict::Stranded(owner) = place.verdict else {
            continue;
        };
        let node = masters[place.master].line.address();
        let outcome = delete_slot(masters, place, owner).await;
        let (count, problem, restored) = match outcome {
            Ok(count) => (count, None, true),
            Err(Failure {
                count,
                why,
                restored,
            }) => (count, Some(why), restored),
        };
        deleted += count;
        match problem {
            None if json => emit(json!({
                "event": "deleted", "node": node, "slot": place.slot, "keys": count,
            })),
            None => sayln!(
                "deleted {node} slot {} {}",
                place.slot,
                plural(count, "key")
            ),
            Some(why) => {
                all_done = false;
                if json {
                    emit(json!({
                        "event": "delete-failed", "node": node, "slot": place.slot,
                        "deleted": count, "restored": restored, "message": why,
                    }));
                } else {
                    eprintln!("lockctl: slot {} on {node}: {why}", place.slot);
                }
            }
        }
    }
    (deleted, all_done)
}

/// Why a slot's deletion stopped: the keys gone before, the reason, and whether the slot is
/// stable again on the node (`false`: `CLUSTER SETSLOT <slot> STABLE` there by hand).
struct Failure {
    count: usize,
    why: String,
    restored: bool,
}

async fn delete_slot(
    masters: &mut [Master],
    place: &Found,
    owner: usize,
) -> Result<usize, Failure> {
    let nothing = |why: String| Failure {
        count: 0,
        why: format!("{why}; nothing deleted"),
        restored: true,
    };
    let slot = place.slot;
    let owner_id = {
        let Ok((conn, _)) = &mut masters[owner].reached else {
            return Err(nothing("its owner did not answer".into()));
        };
        let own = still(conn).await.map_err(nothing)?;
        if !own.serves(slot) || own.open.contains(&slot) {
            return Err(nothing("its owner no longer owns it stably".into()));
        }
        own.id
    };
    let Ok((conn, _)) = &mut masters[place.master].reached else {
        return Err(nothing("the node did not answer".into()));
    };
    let own = still(conn).await.map_err(nothing)?;
    if own.serves(slot) || own.open.contains(&slot) {
        return Err(nothing("the slot is no longer stable there".into()));
    }
    let importing: RedisResult<()> = redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg("IMPORTING")
        .arg(&owner_id)
        .query_async(conn)
        .await;
    // Refused: the slot was not opened, so it is not closed either (it may be someone else's
    // migration now).
    importing.map_err(|err| nothing(format!("CLUSTER SETSLOT IMPORTING refused: {err}")))?;
    let mut count = 0;
    let mut problem = None;
    for batch in place.keys.chunks(PIPELINE / 2) {
        let mut pipe = redis::pipe();
        for key in batch {
            pipe.cmd("ASKING").ignore().cmd("DEL").arg(key);
        }
        match pipe.query_async::<Vec<usize>>(conn).await {
            Ok(gone) => count += gone.iter().sum::<usize>(),
            Err(err) => {
                problem = Some(format!("DEL failed: {err}"));
                break;
            }
        }
    }
    let stable: RedisResult<()> = redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg("STABLE")
        .query_async(conn)
        .await;
    match (problem, stable) {
        (None, Ok(())) => Ok(count),
        (problem, Ok(())) => Err(Failure {
            count,
            why: problem.unwrap_or_default(),
            restored: true,
        }),
        (problem, Err(err)) => Err(Failure {
            count,
            why: format!(
                "{}the slot is left IMPORTING ({err}): run CLUSTER SETSLOT {slot} STABLE on it",
                problem.map_or_else(String::new, |problem| format!("{problem}; "))
            ),
            restored: false,
        }),
    }
}

/// A node's own line, asked again now.
async fn still(conn: &mut MultiplexedConnection) -> Result<NodeLine, String> {
    let nodes = cluster_nodes(conn).await.map_err(|err| err.to_string())?;
    myself(&nodes).map_err(|err| err.to_string())
}

fn show_stranded(node: &str, slot: u16, key: &[u8], owner: &str, json: bool) {
    let key = String::from_utf8_lossy(key);
    if json {
        emit(json!({"event": "stranded", "node": node, "slot": slot, "key": key, "owner": owner}));
    } else {
        sayln!(
            "stranded {node} slot {slot} {} (owner {owner})",
            printable(&key)
        );
    }
}

fn show_skipped(node: &str, place: &Found, why: &str, json: bool) {
    if json {
        let keys: Vec<_> = place
            .keys
            .iter()
            .map(|key| String::from_utf8_lossy(key))
            .collect();
        emit(json!({
            "event": "skipped", "node": node, "slot": place.slot, "keys": keys, "reason": why,
        }));
    } else {
        sayln!(
            "skipped {node} slot {}: {} under the prefix, not stranded: {why}",
            place.slot,
            plural(place.keys.len(), "key")
        );
    }
}

/// A master that could not be checked: its keys are unknown, and lockctl exits 1.
fn unchecked(line: &NodeLine, why: &str, json: bool) {
    let node = line.address();
    if json {
        emit(json!({"event": "unchecked", "node": node, "message": why}));
    } else {
        eprintln!("lockctl: {node} was not checked: {why}");
    }
}

/// A key as one word of a line: quoted, with escapes, when it holds spaces or control
/// characters (a lock name may).
fn printable(key: &str) -> String {
    if key.chars().any(|c| c.is_whitespace() || c.is_control()) {
        format!("{key:?}")
    } else {
        key.to_owned()
    }
}

fn distinct_masters(found: &[Found]) -> usize {
    found
        .iter()
        .filter(|place| matches!(place.verdict, Verdict::Stranded(_)))
        .map(|place| place.master)
        .collect::<BTreeSet<_>>()
        .len()
}

/// `1 key`, `2 keys`.
fn plural(count: usize, noun: &str) -> String {
    match count {
        1 => format!("1 {noun}"),
        count => format!("{count} {noun}s"),
    }
}
