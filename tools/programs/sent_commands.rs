//! Counting the commands clients sent to a server, apart from those its scripts ran: `INFO
//! commandstats` counts both together (a plain release's `HDEL` and the release script's look
//! the same there). The slow log, with its threshold at 0, logs every command with the
//! address of the client that ran it, and a script's commands with its Lua client's, which has
//! none (`?:0`). The demo's servers are its own.

use std::collections::BTreeMap;
use std::time::Duration;

use redis::Value;
use redis::aio::MultiplexedConnection;

/// Logs every command `node` runs from now on, from an empty log. The log of a run is tens of
/// thousands of entries: `node` waits for its answers as long as they take.
pub(crate) async fn start(node: &mut MultiplexedConnection) -> redis::RedisResult<()> {
    node.set_response_timeout(Duration::from_secs(60));
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-log-slower-than")
        .arg(0)
        .arg("slowlog-max-len")
        .arg(10_000_000)
        .query_async(node)
        .await?;
    redis::cmd("SLOWLOG").arg("RESET").query_async(node).await
}

/// The commands `node` ran for clients since [`start`], by name (lower case), this program's
/// own left out: `CONFIG`, `SLOWLOG`, `INFO`.
pub(crate) async fn sent(
    node: &mut MultiplexedConnection,
) -> redis::RedisResult<BTreeMap<String, u64>> {
    let log: Vec<Value> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(-1)
        .query_async(node)
        .await?;
    let mut sent = BTreeMap::new();
    for entry in log {
        // An entry: id, time, duration, the command's arguments, the client's address and name.
        let Value::Array(fields) = entry else {
            continue;
        };
        let from_a_script = match fields.get(4) {
            Some(Value::BulkString(address)) => address.ends_with(b":0"),
            _ => true,
        };
        let Some(Value::Array(args)) = fields.get(3).filter(|_| !from_a_script) else {
            continue;
        };
        let Some(Value::BulkString(name)) = args.first() else {
            continue;
        };
        let name = String::from_utf8_lossy(name).to_ascii_lowercase();
        if !["config", "slowlog", "info"].contains(&name.as_str()) {
            *sent.entry(name).or_default() += 1;
        }
    }
    Ok(sent)
}
