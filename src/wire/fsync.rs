//! Whether the servers of a client told that a restart loses no write
//! (`LockClientBuilder::restart_keeps_writes`) sync every write to disk: `appendonly yes` with
//! `appendfsync always`, on every master of a cluster. The scripts see whether a server writes
//! an append-only file, but not how often it syncs it (`INFO` does not show it), so the
//! client asks (`CONFIG GET`) once, when it is built, rather than take its caller's word.

use std::collections::HashMap;

use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
use redis::{Cmd, Value};

use crate::error::{ErrorKind, LockError, Result};
use crate::wire::conn::{Conn, Connections};

/// Checks that every server `connections` reach syncs every write; an
/// [`ErrorKind::InvalidConfig`] naming the first that does not.
pub(crate) async fn every_write_synced(connections: &Connections) -> Result<()> {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg("appendonly").arg("appendfsync");
    let answers = match connections.get("").await? {
        Conn::Server(mut conn, _) => {
            let settings: HashMap<String, String> = cmd.query_async(&mut conn).await?;
            vec![("the server".to_owned(), settings)]
        }
        Conn::Cluster(mut conn, _) => each_master(&mut conn, &cmd).await?,
    };
    for (node, settings) in answers {
        let setting = |name: &str| settings.get(name).map_or("unknown", String::as_str);
        let (appendonly, appendfsync) = (setting("appendonly"), setting("appendfsync"));
        if appendonly != "yes" || appendfsync != "always" {
            return Err(LockError::new(
                ErrorKind::InvalidConfig,
                format!(
                    "restart_keeps_writes(true), but {node} runs appendonly {appendonly} and \
                     appendfsync {appendfsync}: a restart there loses writes (it needs \
                     appendonly yes and appendfsync always)"
                ),
            ));
        }
    }
    Ok(())
}

/// `CONFIG GET` of every master of the cluster, by address.
async fn each_master(
    conn: &mut redis::cluster_async::ClusterConnection,
    cmd: &Cmd,
) -> Result<Vec<(String, HashMap<String, String>)>> {
    let every_master = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
    let Value::Map(replies) = conn.route_command(cmd.clone(), every_master).await? else {
        return Err(LockError::new(
            ErrorKind::Redis,
            "CONFIG GET on every master answered no map of masters",
        ));
    };
    replies
        .into_iter()
        .map(|(node, reply)| {
            let node: String = redis::from_redis_value(node).map_err(redis::RedisError::from)?;
            let reply = match reply {
                Value::ServerError(err) => return Err(redis::RedisError::from(err).into()),
                reply => reply,
            };
            let settings = redis::from_redis_value(reply).map_err(redis::RedisError::from)?;
            Ok((format!("master {node}"), settings))
        })
        .collect()
}
