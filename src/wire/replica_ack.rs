//! The replicas' acknowledgement of a grant: a write of the connection's own, then WAIT, on
//! the master of the lock's slot.

use redis::Value;
use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};

use crate::scopes::slot_of;
use crate::wire::conn::Conn;

/// A write of this connection's own to `tokens_key` (`INCRBY 0`, which changes nothing but
/// is replicated), then `WAIT replicas timeout_ms`, in one pipeline on one connection (on a
/// cluster, to the master of the key's slot): how many replicas acknowledged every write the
/// node had made before that write. Since Redis 7.2 (and on Valkey) WAIT counts only what
/// its own connection wrote, so a grant written by another client, or a write sent on a
/// connection replaced since, is covered only by a write sent right before the WAIT.
pub(crate) async fn write_and_wait_for_replicas(
    conn: &mut Conn,
    tokens_key: &str,
    replicas: u32,
    timeout_ms: u64,
) -> redis::RedisResult<u32> {
    let mut pipe = redis::pipe();
    pipe.cmd("INCRBY").arg(tokens_key).arg(0);
    pipe.cmd("WAIT").arg(replicas).arg(timeout_ms);
    let replies = match conn {
        Conn::Server(conn, _) => pipe.query_async::<Vec<Value>>(conn).await?,
        Conn::Cluster(conn, _) => {
            let node = Route::new(slot_of(tokens_key), SlotAddr::Master);
            conn.route_pipeline(pipe, 0, 2, SingleNodeRoutingInfo::SpecificNode(node))
                .await?
        }
    };
    match <[Value; 2]>::try_from(replies) {
        // An error reply (the node is a replica now, or a failover unblocked the WAIT) is an
        // error, not a count.
        Ok([Value::ServerError(err), _] | [_, Value::ServerError(err)]) => Err(err.into()),
        Ok([_, acked]) => Ok(redis::from_redis_value(acked)?),
        Err(replies) => Err(redis::RedisError::from((
            redis::ErrorKind::Client,
            "a write and WAIT answered with another number of replies",
            format!("{replies:?}"),
        ))),
    }
}
