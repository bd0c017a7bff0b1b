//! How a Redis or pool failure becomes a [`LockError`]: what is worth retrying (Redis away,
//! loading, failing over), what is this client's fault (access), and what is not.

use crate::error::{ErrorKind, LockError};
use crate::wire::access::access_denied;

impl From<redis::RedisError> for LockError {
    fn from(err: redis::RedisError) -> Self {
        use redis::{ErrorKind as K, ServerErrorKind as S};
        let unavailable = err.is_io_error()
            || err.is_timeout()
            || err.is_connection_dropped()
            || err.is_connection_refusal()
            || matches!(
                err.kind(),
                K::Server(
                    S::BusyLoading | S::TryAgain | S::ClusterDown | S::MasterDown | S::ReadOnly
                )
                    // Redirections the cluster client still met after its retries: the slot
                    // is moving (a failover, a resharding) and will answer from its new node.
                    | K::Server(S::Moved | S::Ask)
                    | K::ClusterConnectionNotFound
                    // The sentinels name no master for now: a failover is under way.
                    | K::MasterNameNotFoundBySentinel
            )
            || stopped_by_a_migrating_slot(&err);
        let kind = if access_denied(&err) {
            ErrorKind::AccessDenied
        } else if unavailable {
            ErrorKind::RedisUnavailable
        } else if err.kind() == K::InvalidClientConfig {
            ErrorKind::InvalidConfig
        } else {
            ErrorKind::Redis
        };
        Self::with_source(kind, err.to_string(), err)
    }
}

/// Whether `err` is a script stopped by its slot's migration (`lua/cluster.lua`): the node
/// refused one of its commands before its first write, and the slot answers again once the
/// migration ends.
pub(crate) fn stopped_by_a_migrating_slot(err: &redis::RedisError) -> bool {
    err.to_string().contains("non local key")
}

impl From<deadpool_redis::PoolError> for LockError {
    fn from(err: deadpool_redis::PoolError) -> Self {
        match err {
            deadpool_redis::PoolError::Backend(redis) => redis.into(),
            deadpool_redis::PoolError::Closed => Self::shut_down(),
            other => Self::with_source(ErrorKind::RedisUnavailable, other.to_string(), other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::error_reply;

    #[test]
    fn a_script_stopped_by_a_migrating_slot_is_redis_unavailable_for_now() {
        let stopped = error_reply(
            "ERR Error running script (call to f_0123): @user_script:12: Script attempted to \
             access a non local key in a cluster node",
        );
        assert_eq!(LockError::from(stopped).kind(), ErrorKind::RedisUnavailable);
        let other = error_reply("ERR Error running script (call to f_0123): @user_script:3: oops");
        assert_eq!(LockError::from(other).kind(), ErrorKind::Redis);
    }
}
