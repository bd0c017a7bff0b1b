//! The simplest lock there is, the peer that the fast-path bench and `scripts/redis-work.sh`
//! measure this library against: `SET key owner NX PX` to take it and a compare-and-delete
//! script to release it (what rslock sends), on one redis-rs multiplexed connection.

use redis::aio::MultiplexedConnection;

const COMPARE_AND_DELETE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
";

/// One multiplexed connection, a fixed owner and lease.
#[derive(Clone)]
pub(crate) struct SimplestLock {
    conn: MultiplexedConnection,
    release: redis::Script,
}

impl SimplestLock {
    pub(crate) async fn connect(url: &str) -> redis::RedisResult<Self> {
        let conn = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        Ok(Self {
            conn,
            release: redis::Script::new(COMPARE_AND_DELETE),
        })
    }

    /// Takes and releases the lock on `key`, which nobody else takes; panics if it was held.
    pub(crate) async fn acquire_release(&self, key: &str) {
        let mut conn = self.conn.clone();
        let taken: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg("owner-1")
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(taken.is_some(), "the simplest lock found {key} held");
        let released: i64 = self
            .release
            .key(key)
            .arg("owner-1")
            .invoke_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(released, 1);
    }
}
