//! A single-server client pointed at a node of a Redis Cluster: the node answers commands for
//! its own slots only and redirects the rest (`MOVED`), and a SCAN sees its keys alone, so
//! such a client would fail some locks and miss others in a listing. It is refused instead,
//! with an error that says to connect as a cluster client: each command connection it checks
//! out asks its server `INFO cluster` first, and an answer only a cluster node gives
//! (`MOVED`, `CROSSSLOT`) that still reaches it is mapped to the same error.

use redis::aio::MultiplexedConnection;
use redis::{ConnectionAddr, ConnectionInfo, ErrorKind as K, RedisError, ServerErrorKind as S};

use crate::error::{ErrorKind, LockError};

/// The line of `INFO cluster` that a cluster node answers with.
const CLUSTER_ENABLED: &str = "cluster_enabled:1";

/// Whether the server of `conn` is a node of a Redis Cluster (one `INFO cluster`).
pub(crate) async fn is_cluster_node(conn: &mut MultiplexedConnection) -> redis::RedisResult<bool> {
    let info: String = redis::cmd("INFO").arg("cluster").query_async(conn).await?;
    Ok(says_cluster_enabled(&info))
}

/// Whether an `INFO cluster` reply says the server is a cluster node.
fn says_cluster_enabled(info: &str) -> bool {
    info.lines().any(|line| line.trim() == CLUSTER_ENABLED)
}

/// The error of every operation of a single-server client whose server, at `url`, is a
/// cluster node: what to do instead.
pub(crate) fn cluster_node_error(url: &str) -> LockError {
    LockError::new(
        ErrorKind::InvalidConfig,
        format!(
            "{url} is a node of a Redis Cluster ({CLUSTER_ENABLED}): connect with \
             LockClient::builder_cluster([\"{url}\"]) (lockctl: --cluster)"
        ),
    )
}

/// Whether `err` is an answer only a cluster node gives: a redirection (`MOVED`, `ASK`), or
/// the refusal of keys in several slots (`CROSSSLOT`, which a script of a single-server
/// client meets: its epoch key has no hash tag). On a single-server client, the sign that its
/// server is a cluster node.
pub(crate) fn is_cluster_answer(err: &RedisError) -> bool {
    matches!(err.kind(), K::Server(S::Moved | S::Ask | S::CrossSlot))
}

/// The server of `info` as a URL without credentials nor database, for messages:
/// `redis://host:port`, `rediss://host:port` or `redis+unix:///path`.
pub(crate) fn url_of(info: &ConnectionInfo) -> String {
    match info.addr() {
        ConnectionAddr::Tcp(host, port) => format!("redis://{host}:{port}"),
        ConnectionAddr::TcpTls { host, port, .. } => format!("rediss://{host}:{port}"),
        ConnectionAddr::Unix(path) => format!("redis+unix://{}", path.display()),
        other => format!("redis://{other}"),
    }
}

#[cfg(test)]
mod tests {
    use redis::IntoConnectionInfo;

    use super::*;
    use crate::wire::error_reply as reply;

    #[test]
    fn only_a_node_with_cluster_enabled_is_one() {
        assert!(says_cluster_enabled("# Cluster\r\ncluster_enabled:1\r\n"));
        assert!(!says_cluster_enabled("# Cluster\r\ncluster_enabled:0\r\n"));
        assert!(!says_cluster_enabled(""));
    }

    #[test]
    fn answers_only_a_cluster_node_gives_are_told_from_other_errors() {
        assert!(is_cluster_answer(&reply("MOVED 3999 127.0.0.1:6381")));
        assert!(is_cluster_answer(&reply("ASK 3999 127.0.0.1:6381")));
        assert!(is_cluster_answer(&reply(
            "CROSSSLOT Keys in request don't hash to the same slot"
        )));
        assert!(!is_cluster_answer(&reply("TRYAGAIN Multiple keys request")));
        assert!(!is_cluster_answer(&reply("ERR unknown command")));
    }

    #[test]
    fn the_error_names_the_server_without_credentials_and_what_to_use() {
        let info = "redis://locker:s3cret@10.0.0.7:7001/0"
            .into_connection_info()
            .unwrap();
        let url = url_of(&info);
        assert_eq!(url, "redis://10.0.0.7:7001");
        let err = cluster_node_error(&url);
        assert_eq!(err.kind(), ErrorKind::InvalidConfig);
        assert_eq!(
            err.to_string(),
            "invalid configuration: redis://10.0.0.7:7001 is a node of a Redis Cluster \
             (cluster_enabled:1): connect with \
             LockClient::builder_cluster([\"redis://10.0.0.7:7001\"]) (lockctl: --cluster)"
        );
    }
}
