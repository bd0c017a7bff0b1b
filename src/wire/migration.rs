//! Scripts in a cluster slot that migrates between nodes (a resharding, also one left half
//! done). While a slot migrates, its keys are split between the node that owns it and the
//! node importing it, and a node refuses a script that names keys it does not have all of
//! (`TRYAGAIN`): the lock's queue, its marker and its grant block rarely exist, so every
//! script of the slot would be refused until the operator finishes the migration.
//!
//! Instead the script's keys move first: the client moves every key the script names from
//! the owner to the importing node (`MIGRATE … KEYS`; one that is not there is skipped),
//! and runs the script there (`ASKING`, then the script with its first key alone declared,
//! which an importing node accepts whatever keys it holds yet: see `lua/migration.lua` for
//! how the others are passed). So each lock's state, and its slot's epoch and token counter,
//! are in one place when a script reads them, and a script never runs on a node that lacks
//! some of them. Such a script writes only keys it names (the epoch's marker is left out),
//! and those were moved first, so the operator's own moves never meet a key both nodes hold.
//!
//! This needs `+migrate +asking +cluster|nodes` from an ACL, and the `MIGRATE` carries the
//! client's own credentials (`AUTH2` or `AUTH`) to the importing node, which takes the same
//! ones on a cluster whose nodes need a password. The migration itself is the operator's:
//! once finished (`CLUSTER SETSLOT … NODE`), the slot answers as any other.

use std::collections::BTreeSet;
use std::sync::Mutex;

use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Arg, Cmd, ErrorKind, FromRedisValue, RedisError, RedisResult, ServerErrorKind, Value};

use crate::scopes::slot_of;
use crate::wire::conn::ClusterConn;

/// The first argument of a script run with its first key alone declared, followed by the
/// count of the other keys and those keys (read by `lua/migration.lua`).
pub(crate) const MOVED_KEYS_MARK: &str = "\0moved-keys";

/// How long the owner may take to move a script's keys (`MIGRATE`'s timeout, ms).
const MIGRATE_TIMEOUT_MS: u64 = 2_000;

/// Slots this process saw migrating (on any cluster): their scripts go the migration's way
/// first. A slot no longer migrating costs one `CLUSTER NODES` and is forgotten.
static MIGRATING: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// Whether the slot of `cmd`'s first key was seen migrating lately.
pub(crate) fn seen_migrating(cmd: &Cmd) -> bool {
    let migrating = MIGRATING.lock().expect("migrating");
    // Most clients never see a slot migrate: no script's arguments are read for it then.
    !migrating.is_empty() && first_key(cmd).is_some_and(|key| migrating.contains(&slot_of(&key)))
}

/// Whether `err` is a node's refusal of a script because its slot migrates.
pub(crate) fn refused_by_migration(err: &RedisError) -> bool {
    matches!(
        err.kind(),
        ErrorKind::Server(ServerErrorKind::TryAgain | ServerErrorKind::Ask)
    ) || err.to_string().contains("non local key")
}

/// Runs `script` (the `EVAL` of `cmd`, an `EVALSHA` of its script) the migration's way, when
/// the slot of its first key migrates. `None` when it does not (the caller's error stands).
pub(crate) async fn run<T: FromRedisValue>(
    conn: &mut ClusterConn,
    cmd: &Cmd,
    source: &str,
) -> RedisResult<Option<T>> {
    let args = plain_args(cmd);
    let (keys, rest) = split_keys(&args);
    let Some(first) = keys.first() else {
        return Ok(None);
    };
    let slot = slot_of(&String::from_utf8_lossy(first));
    let owner = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
        slot,
        SlotAddr::Master,
    )));
    let nodes: String = parse(
        conn.route_command(redis::cmd("CLUSTER").arg("NODES").clone(), owner.clone())
            .await?,
    )?;
    let Some((host, port)) = importing_node(&nodes, slot) else {
        MIGRATING.lock().expect("migrating").remove(&slot);
        return Ok(None);
    };
    MIGRATING.lock().expect("migrating").insert(slot);

    let mut migrate = redis::cmd("MIGRATE");
    migrate
        .arg(&host)
        .arg(port)
        .arg("")
        .arg(0)
        .arg(MIGRATE_TIMEOUT_MS);
    conn.auth.add_to(&mut migrate);
    migrate.arg("KEYS");
    for key in keys {
        migrate.arg(*key);
    }
    // "OK", or "NOKEY" when none of them is on the owner any more.
    let _: String = parse(conn.route_command(migrate, owner).await?)?;

    let mut eval = redis::cmd("EVAL");
    eval.arg(source)
        .arg(1)
        .arg(*first)
        .arg(MOVED_KEYS_MARK)
        .arg(keys.len() - 1);
    for key in &keys[1..] {
        eval.arg(*key);
    }
    for arg in rest {
        eval.arg(*arg);
    }
    let mut pipe = redis::pipe();
    pipe.cmd("ASKING");
    pipe.add_command(eval);
    let importing = SingleNodeRoutingInfo::ByAddress { host, port };
    let mut replies = conn.route_pipeline(pipe, 1, 1, importing).await?;
    let reply = replies.pop().unwrap_or(Value::Nil);
    parse(reply).map(Some)
}

/// The key of `cmd` (an `EVALSHA`) that routes it.
fn first_key(cmd: &Cmd) -> Option<String> {
    let args = plain_args(cmd);
    split_keys(&args)
        .0
        .first()
        .map(|key| String::from_utf8_lossy(key).into_owned())
}

/// The arguments of `cmd`, every one plain bytes (as every script's are).
fn plain_args(cmd: &Cmd) -> Vec<&[u8]> {
    cmd.args_iter()
        .filter_map(|arg| match arg {
            Arg::Simple(bytes) => Some(bytes),
            _ => None,
        })
        .collect()
}

/// The keys and the other arguments of an `EVALSHA sha count keys… args…`.
fn split_keys<'a, 'b>(args: &'b [&'a [u8]]) -> (&'b [&'a [u8]], &'b [&'a [u8]]) {
    let count = args
        .get(2)
        .and_then(|count| std::str::from_utf8(count).ok())
        .and_then(|count| count.parse::<usize>().ok())
        .unwrap_or(0);
    let keys_end = (3 + count).min(args.len());
    (&args[3.min(keys_end)..keys_end], &args[keys_end..])
}

/// The node importing `slot` from the node whose `CLUSTER NODES` is `nodes` (its own line
/// shows `[<slot>->-<node id>]` while the slot migrates away), as host and port.
fn importing_node(nodes: &str, slot: u16) -> Option<(String, u16)> {
    let myself = nodes.lines().find(|line| {
        line.split(' ')
            .nth(2)
            .is_some_and(|flags| flags.split(',').any(|flag| flag == "myself"))
    })?;
    let marker = format!("[{slot}->-");
    let target = myself
        .split(' ')
        .find_map(|field| field.strip_prefix(&marker)?.strip_suffix(']'))?;
    let line = nodes
        .lines()
        .find(|line| line.split(' ').next() == Some(target))?;
    // `host:port@cluster port[,hostname]`
    let address = line.split(' ').nth(1)?.split('@').next()?;
    let (host, port) = address.rsplit_once(':')?;
    Some((host.to_owned(), port.parse().ok()?))
}

/// A reply as `T`; a node's error reply as an error.
fn parse<T: FromRedisValue>(value: Value) -> RedisResult<T> {
    match value {
        Value::ServerError(err) => Err(err.into()),
        value => Ok(redis::from_redis_value(value)?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODES: &str = "\
7e7a 127.0.0.1:32950@42950 myself,master - 0 1795805378000 3 connected 10923-16383 [16287->-bb13]
bb13 127.0.0.1:32948@42948 master - 0 1795805378000 1 connected 0-5460 [16287-<-7e7a]
c0ff 127.0.0.1:32949@42949 master - 0 1795805378000 2 connected 5461-10922
";

    #[test]
    fn the_importing_node_is_read_from_the_owners_own_line() {
        assert_eq!(
            importing_node(NODES, 16287),
            Some(("127.0.0.1".to_owned(), 32948))
        );
        assert_eq!(importing_node(NODES, 16286), None, "not migrating");
        // The importing node's own view names no node to move to.
        let seen_by_target = NODES.replace("myself,master", "master").replace(
            "bb13 127.0.0.1:32948@42948 master",
            "bb13 127.0.0.1:32948@42948 myself,master",
        );
        assert_eq!(importing_node(&seen_by_target, 16287), None);
    }

    #[test]
    fn an_evalsha_is_split_into_its_keys_and_its_arguments() {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg("sha")
            .arg(2)
            .arg("lock:{a}")
            .arg("lock:{a}:q")
            .arg("prefix")
            .arg(7);
        let args = plain_args(&cmd);
        let (keys, rest) = split_keys(&args);
        assert_eq!(keys, [b"lock:{a}".as_slice(), b"lock:{a}:q"]);
        assert_eq!(rest, [b"prefix".as_slice(), b"7"]);
        assert_eq!(first_key(&cmd).as_deref(), Some("lock:{a}"));
    }
}
