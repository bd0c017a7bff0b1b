//! SCAN, one call at a time, on the one server or on each master of a cluster; never `KEYS`,
//! so a Redis with millions of keys costs each call a bounded share of its time.

use std::collections::HashMap;

use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, FromRedisValue, Value};

use crate::wire::conn::Conn;

/// The nodes to scan, each named by a slot it serves: `[0]` for one server, and for a
/// cluster the lowest slot of each master, in ascending order.
pub(crate) async fn nodes(conn: &mut Conn) -> redis::RedisResult<Vec<u16>> {
    let Conn::Cluster(conn, _) = conn else {
        return Ok(vec![0]);
    };
    let mut slots = redis::cmd("CLUSTER");
    slots.arg("SLOTS");
    let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
    let ranges: Vec<Vec<Value>> = parse(conn.route_command(slots, routing).await?)?;
    // CLUSTER SLOTS: [start, end, [master host, master port, ...], replicas...] per range.
    let mut lowest: HashMap<(String, i64), u16> = HashMap::new();
    for range in ranges {
        let mut fields = range.into_iter();
        let (Some(start), Some(_end), Some(master)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let start: u16 = parse(start)?;
        let mut master = parse::<Vec<Value>>(master)?.into_iter();
        let (Some(host), Some(port)) = (master.next(), master.next()) else {
            continue;
        };
        let entry = lowest.entry((parse(host)?, parse(port)?)).or_insert(start);
        *entry = (*entry).min(start);
    }
    let mut nodes: Vec<u16> = lowest.into_values().collect();
    nodes.sort_unstable();
    Ok(nodes)
}

/// One `SCAN cursor MATCH pattern COUNT count TYPE hash` on `node` (a slot its master
/// serves; ignored on one server): the next cursor (0 when that node is done) and the keys,
/// those that are not UTF-8 left out.
pub(crate) async fn scan_hashes(
    conn: &mut Conn,
    node: u16,
    cursor: u64,
    pattern: &str,
    count: usize,
) -> redis::RedisResult<(u64, Vec<String>)> {
    let mut scan = redis::cmd("SCAN");
    scan.arg(cursor)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(count)
        .arg("TYPE")
        .arg("hash");
    let (next, keys): (u64, Vec<Vec<u8>>) = on_node(conn, node, scan).await?;
    let keys = keys
        .into_iter()
        .filter_map(|key| String::from_utf8(key).ok())
        .collect();
    Ok((next, keys))
}

/// Runs `command` on the server, or on the master of `slot`.
async fn on_node<T: FromRedisValue>(
    conn: &mut Conn,
    slot: u16,
    command: Cmd,
) -> redis::RedisResult<T> {
    match conn {
        Conn::Server(conn, _) => command.query_async(conn).await,
        Conn::Cluster(conn, _) => {
            let node = Route::new(slot, SlotAddr::Master);
            let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(node));
            parse(conn.route_command(command, routing).await?)
        }
    }
}

/// A reply as `T`; a node's error reply as an error.
fn parse<T: FromRedisValue>(value: Value) -> redis::RedisResult<T> {
    match value {
        Value::ServerError(err) => Err(err.into()),
        value => Ok(redis::from_redis_value(value)?),
    }
}
