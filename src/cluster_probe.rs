//! Telling a node of a Redis Cluster from a lone server before a client is built, for a tool
//! given a URL that may name either: `lockctl` switches to cluster mode on its own.

use crate::client::LockClientBuilder;
use crate::error::{LockError, Result};
use crate::wire::cluster_node::is_cluster_node;

impl LockClientBuilder {
    /// Whether the Redis at this builder's URL is a node of a Redis Cluster (`INFO cluster`
    /// says `cluster_enabled:1`), asked over a connection of its own made with this builder's
    /// credentials and TLS settings, and closed after (the builders of a cluster or Sentinel
    /// client ask their first URL). A client of one server built for a cluster node fails
    /// every operation with [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig): a
    /// tool that may be given either builds with
    /// [`LockClient::builder_cluster`](crate::LockClient::builder_cluster) when this says so.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) for an unparsable URL
    /// or unusable TLS settings, as [`Self::build`];
    /// [`ErrorKind::RedisUnavailable`](crate::ErrorKind::RedisUnavailable) when the server
    /// does not answer within the command timeout;
    /// [`ErrorKind::AccessDenied`](crate::ErrorKind::AccessDenied) when it refuses the
    /// credentials, the certificate or `INFO`.
    pub async fn points_to_cluster_node(&self) -> Result<bool> {
        let client = self.endpoint.client()?;
        tokio::time::timeout(self.config.command_timeout, async {
            let mut conn = client.get_multiplexed_async_connection().await?;
            Ok(is_cluster_node(&mut conn).await?)
        })
        .await
        .map_err(|_| LockError::command_timeout())?
    }
}
