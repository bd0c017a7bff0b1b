//! What lockctl's clients connect to: the topology the URLs name, and the settings of the
//! connections the options ask for.

use std::time::Duration;

use tower_redis_lock::LockClientBuilder;

/// Which Redis the URLs name.
pub(crate) enum Topology {
    /// One server (or, for `--kind redlock`, independent servers); before `connect::settle`,
    /// also the plain `--url`s that may be nodes of a cluster.
    Servers,
    /// Seeds of one Redis Cluster.
    Cluster,
    /// Sentinels, and the name of the master they watch.
    Sentinel(String),
}

/// The usage error of several plain `--url` whose first is no cluster node.
pub(crate) const SEVERAL_URLS: &str =
    "several --url are for --kind redlock, --cluster or --sentinel (or nodes of a cluster)";

/// The settings of lockctl's clients the options ask for.
#[derive(Default)]
pub(crate) struct Settings {
    pub(crate) prefix: Option<String>,
    pub(crate) instance_name: Option<String>,
    /// `hold --watchdog-lease`: how long a held lock outlives a lockctl that stops renewing
    /// it (killed, or cut off from Redis).
    pub(crate) watchdog_lease: Option<Duration>,
    /// `--tls-ca`: the CA certificate (PEM) a `rediss://` server's certificate must chain to.
    pub(crate) tls_ca: Option<Vec<u8>>,
    /// `--tls-cert` and `--tls-key`: a client certificate and its key (PEM).
    pub(crate) tls_client: Option<(Vec<u8>, Vec<u8>)>,
}

impl Settings {
    /// The options given set on `builder`; the rest keep the library's defaults.
    pub(crate) fn apply(&self, mut builder: LockClientBuilder) -> LockClientBuilder {
        if let Some(prefix) = &self.prefix {
            builder = builder.key_prefix(prefix);
        }
        if let Some(name) = &self.instance_name {
            builder = builder.instance_name(name);
        }
        if let Some(lease) = self.watchdog_lease {
            builder = builder.watchdog_lease(lease);
        }
        if let Some(ca) = &self.tls_ca {
            builder = builder.tls_root_certificate(ca.clone());
        }
        if let Some((certificate, key)) = &self.tls_client {
            builder = builder.tls_client_certificate(certificate.clone(), key.clone());
        }
        builder
    }
}
