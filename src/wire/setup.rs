//! How a client's connections are set up: the pool of one server's, and the settings of a
//! cluster client. Neither connects before the first command.

use std::time::Duration;

use deadpool_redis::{Manager, Pool, Runtime};
use redis::cluster::ClusterClientBuilder;

use crate::error::{ErrorKind, LockError, Result};
use crate::lease::MAX_LEASE;

/// The settings of a cluster client of `seeds`: connections time out with the command
/// timeout, and replies are bounded by the callers alone (as `Connections::get` does for
/// one server), so a reply to a script that took a lock is never cut off unseen. Retries
/// (a redirection, a node away) come within milliseconds rather than redis-rs's default
/// second and more, and give up well within the command timeout: a slot that migrates
/// refuses the scripts of its locks until the migration ends (`wire/lua/cluster.lua`), which
/// the callers' own bounds ride out as they do a node that is away.
pub(crate) fn cluster_builder(seeds: &[String], command_timeout: Duration) -> ClusterClientBuilder {
    ClusterClientBuilder::new(seeds.iter().map(String::as_str))
        .connection_timeout(command_timeout)
        .response_timeout(MAX_LEASE)
        .retries(CLUSTER_RETRIES)
        .min_retry_wait(CLUSTER_RETRY_WAIT_MS.0)
        .max_retry_wait(CLUSTER_RETRY_WAIT_MS.1)
}

/// How many times the cluster client retries a command (redirections included), and the
/// least and most it waits before each retry (ms): at most about half a second in all.
const CLUSTER_RETRIES: u32 = 6;
const CLUSTER_RETRY_WAIT_MS: (u64, u64) = (10, 100);

/// A pool of `connections` connections to the client's Redis. Their response timeout is
/// lifted when the client checks one out (see `Connections::get`), so the command timeout
/// alone bounds a reply.
pub(crate) fn create_pool(
    client: &redis::Client,
    connections: usize,
    command_timeout: Duration,
) -> Result<Pool> {
    let manager = Manager::new(client.get_connection_info().clone()).map_err(|err| {
        LockError::with_source(ErrorKind::InvalidConfig, "invalid redis url", err)
    })?;
    Pool::builder(manager)
        .max_size(connections)
        .wait_timeout(Some(command_timeout))
        .create_timeout(Some(command_timeout))
        .recycle_timeout(Some(command_timeout))
        .runtime(Runtime::Tokio1)
        .build()
        .map_err(|err| {
            LockError::with_source(ErrorKind::InvalidConfig, "cannot build the pool", err)
        })
}
