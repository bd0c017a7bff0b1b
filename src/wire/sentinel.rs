//! Reaching the master that Redis Sentinel names: asked again for every new connection, so
//! that after a failover commands and pub/sub follow the new master.

use std::sync::Arc;

use redis::sentinel::{SentinelClient, SentinelServerType};

use crate::error::{ErrorKind, LockError, Result};

/// Lookups asked again when the sentinels name no master (a failover settling).
const LOOKUP_RETRIES: u32 = 4;
/// Pause between those lookups.
const LOOKUP_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// How a new connection finds its server: the one URL, or the master Sentinel names now.
#[derive(Clone)]
pub(crate) enum Dialer {
    Direct(Box<redis::Client>),
    Sentinel(Arc<tokio::sync::Mutex<SentinelClient>>),
}

impl std::fmt::Debug for Dialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Direct(_) => "Dialer::Direct",
            Self::Sentinel(_) => "Dialer::Sentinel",
        })
    }
}

impl Dialer {
    /// A dialer of the master `master_name` that the sentinels at `sentinel_urls` monitor.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidConfig`] for no URL, or one that cannot be parsed.
    pub(crate) fn sentinel(sentinel_urls: &[String], master_name: &str) -> Result<Self> {
        if sentinel_urls.is_empty() {
            return Err(LockError::new(
                ErrorKind::InvalidConfig,
                "Sentinel needs at least one sentinel URL",
            ));
        }
        let urls: Vec<&str> = sentinel_urls.iter().map(String::as_str).collect();
        let client = SentinelClient::build(urls, master_name, None, SentinelServerType::Master)
            .map_err(|err| {
                LockError::with_source(ErrorKind::InvalidConfig, "invalid sentinel url", err)
            })?;
        Ok(Self::Sentinel(Arc::new(tokio::sync::Mutex::new(client))))
    }

    /// A client of the server to connect to now (for Sentinel, the master it names now).
    /// While a failover settles, sentinels may name no master for a moment: the lookup is
    /// asked again a few times (the callers bound the whole by their command timeout).
    pub(crate) async fn client(&self) -> redis::RedisResult<redis::Client> {
        let sentinel = match self {
            Self::Direct(client) => return Ok((**client).clone()),
            Self::Sentinel(sentinel) => sentinel,
        };
        let mut tries = 0;
        loop {
            match sentinel.lock().await.async_get_client().await {
                Err(err)
                    if err.kind() == redis::ErrorKind::MasterNameNotFoundBySentinel
                        && tries < LOOKUP_RETRIES =>
                {
                    tries += 1;
                    tokio::time::sleep(LOOKUP_PAUSE).await;
                }
                outcome => return outcome,
            }
        }
    }
}
