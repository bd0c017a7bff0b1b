//! Where a benchmark runs: one Redis server, or a Redis Cluster (for this library only: the
//! peers lock on one server). Everything that differs between the two is here: how the lock
//! client and the critical section's connection are made, and how the benchmark's own
//! statistics and counters are read (from every master of a cluster, summed).

use std::collections::BTreeMap;

use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use serde::{Deserialize, Serialize};
use tower_redis_lock::LockClient;

use crate::commandstats;
use crate::helpers::Res;
use crate::helpers::connect;

/// The Redis a run talks to: one server's URL, or the seed URLs of a cluster.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Deployment {
    urls: Vec<String>,
    cluster: bool,
}

impl Deployment {
    pub(crate) fn server(url: String) -> Self {
        Self {
            urls: vec![url],
            cluster: false,
        }
    }

    pub(crate) fn cluster(seeds: Vec<String>) -> Self {
        Self {
            urls: seeds,
            cluster: true,
        }
    }

    pub(crate) fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// The server's URL, or the first seed's.
    pub(crate) fn url(&self) -> &str {
        &self.urls[0]
    }

    /// This library's client, with its defaults.
    pub(crate) async fn lock_client(&self) -> Res<LockClient> {
        Ok(if self.cluster {
            LockClient::builder_cluster(&self.urls).build().await?
        } else {
            LockClient::connect(self.url()).await?
        })
    }

    /// A connection for plain data commands, routed to the key's node on a cluster.
    pub(crate) async fn store(&self) -> Res<Store> {
        Ok(if self.cluster {
            let client = redis::cluster::ClusterClient::new(self.urls.clone())?;
            Store::Cluster(client.get_async_connection().await?)
        } else {
            Store::Server(connect(self.url()).await?)
        })
    }

    /// The benchmark's own connections: the PING probe on the (first) server, and one
    /// connection to each master for the command statistics.
    pub(crate) async fn control(&self) -> Res<Control> {
        let mut probe = connect(self.url()).await?;
        let masters = if self.cluster {
            let mut masters = Vec::new();
            for address in master_addresses(&mut probe).await? {
                masters.push(connect(&format!("redis://{address}")).await?);
            }
            masters
        } else {
            vec![probe.clone()]
        };
        Ok(Control {
            probe,
            masters,
            store: self.store().await?,
        })
    }
}

/// `host:port` of every master that is not failing, from `CLUSTER NODES`.
async fn master_addresses(conn: &mut MultiplexedConnection) -> Res<Vec<String>> {
    let nodes: String = redis::cmd("CLUSTER").arg("NODES").query_async(conn).await?;
    let masters: Vec<String> = nodes
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let flags = fields.get(2)?;
            let serving = flags.contains("master") && !flags.contains("fail");
            let address = fields.get(1)?.split(['@', ',']).next()?;
            serving.then(|| address.to_owned())
        })
        .collect();
    if masters.is_empty() {
        return Err("CLUSTER NODES names no master".into());
    }
    Ok(masters)
}

/// A data connection to one server or to a cluster.
#[derive(Clone)]
pub(crate) enum Store {
    Server(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Store {
    pub(crate) async fn query<T: redis::FromRedisValue>(&mut self, cmd: &redis::Cmd) -> Res<T> {
        Ok(match self {
            Self::Server(conn) => cmd.query_async(conn).await?,
            Self::Cluster(conn) => cmd.query_async(conn).await?,
        })
    }
}

/// The parent's connections for the probe, the statistics and the counters.
pub(crate) struct Control {
    pub(crate) probe: MultiplexedConnection,
    masters: Vec<MultiplexedConnection>,
    store: Store,
}

impl Control {
    /// How many masters the statistics are read from.
    pub(crate) fn masters(&self) -> usize {
        self.masters.len()
    }

    /// `CONFIG RESETSTAT` on every master.
    pub(crate) async fn reset_stats(&mut self) -> Res<()> {
        for master in &mut self.masters {
            let () = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query_async(master)
                .await?;
        }
        Ok(())
    }

    /// Calls per command since the last reset, from `INFO commandstats`, summed over the
    /// masters. Script internals are counted too, each under its own name.
    pub(crate) async fn command_calls(&mut self) -> Res<BTreeMap<String, u64>> {
        let mut calls = BTreeMap::new();
        for master in &mut self.masters {
            let stats: String = redis::cmd("INFO")
                .arg("commandstats")
                .query_async(master)
                .await?;
            for (name, count) in commandstats::calls_by_command(&stats) {
                *calls.entry(name).or_default() += count;
            }
        }
        Ok(calls)
    }

    /// CPU seconds the masters' processes have used so far (`used_cpu_sys` plus
    /// `used_cpu_user` of `INFO cpu`, summed): the work a run leaves inside Redis, kernel
    /// included, read before and after it (no `CONFIG RESETSTAT` resets these).
    pub(crate) async fn cpu_seconds(&mut self) -> Res<f64> {
        let mut seconds = 0.0;
        for master in &mut self.masters {
            let info: String = redis::cmd("INFO").arg("cpu").query_async(master).await?;
            seconds += cpu_seconds_of(&info)?;
        }
        Ok(seconds)
    }

    /// The values of `keys`, each then deleted (one key at a time: on a cluster they live
    /// in different slots).
    pub(crate) async fn take_counters(&mut self, keys: &[String]) -> Res<Vec<u64>> {
        let mut values = Vec::with_capacity(keys.len());
        for key in keys {
            let value: Option<u64> = self.store.query(redis::cmd("GET").arg(key)).await?;
            let _: i64 = self.store.query(redis::cmd("DEL").arg(key)).await?;
            values.push(value.unwrap_or_default());
        }
        Ok(values)
    }
}

/// System plus user CPU seconds of the server itself, from `INFO cpu`'s text (its children's
/// fields, `used_cpu_sys_children` and the like, are left out).
fn cpu_seconds_of(info: &str) -> Res<f64> {
    let mut seconds = 0.0;
    let mut found = 0;
    for line in info.lines() {
        if let Some((name, value)) = line.trim_end().split_once(':')
            && (name == "used_cpu_sys" || name == "used_cpu_user")
        {
            seconds += value.parse::<f64>()?;
            found += 1;
        }
    }
    if found != 2 {
        return Err(format!("INFO cpu without used_cpu_sys and used_cpu_user: {info:?}").into());
    }
    Ok(seconds)
}

#[cfg(test)]
mod tests {
    use super::cpu_seconds_of;

    #[test]
    fn the_server_cpu_is_its_own_system_and_user_time() {
        let info = "# CPU\r\nused_cpu_sys:2.417775\r\nused_cpu_user:1.849800\r\n\
                    used_cpu_sys_children:9.0\r\nused_cpu_user_children:9.0\r\n";
        let seconds = cpu_seconds_of(info).unwrap();
        assert!((seconds - 4.267575).abs() < 1e-9, "{seconds}");
        assert!(cpu_seconds_of("# CPU\r\nused_cpu_sys:1.0\r\n").is_err());
    }
}
