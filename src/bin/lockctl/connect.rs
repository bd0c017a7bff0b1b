//! The clients a command runs on: one for a server, a cluster or a sentinel-watched master,
//! or one per server for a quorum lock, each built with the settings the options ask for and
//! shut down before lockctl exits.

use std::process::ExitCode;
use std::time::Duration;

use tower_redis_lock::{LockClient, LockClientBuilder, LockError, RedLock};

use crate::args::{Command, Kind, Topology};
use crate::dispatch::run_on;
use crate::hold::{hold_redlock, lease_of};

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
    fn apply(&self, mut builder: LockClientBuilder) -> LockClientBuilder {
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

/// Connects the clients `topology` asks for (one per server for a quorum lock), runs
/// `command` on them and shuts them down before lockctl exits.
pub(crate) async fn run(
    urls: &[String],
    topology: &Topology,
    settings: &Settings,
    command: Command,
) -> Result<ExitCode, LockError> {
    if let Command::Hold {
        name,
        hold_for,
        lease,
        wait,
        kind: Kind::RedLock,
    } = &command
    {
        let mut clients = Vec::with_capacity(urls.len());
        for url in urls {
            clients.push(settings.apply(LockClient::builder(url)).build().await?);
        }
        let lock = RedLock::new(clients.clone(), name)?.with_lease(lease_of(*lease));
        let outcome = hold_redlock(lock, *hold_for, *wait).await;
        for locks in &clients {
            locks.shutdown().await;
        }
        return outcome;
    }
    let builder = match topology {
        Topology::Servers => LockClient::builder(&urls[0]),
        Topology::Cluster => LockClient::builder_cluster(urls),
        Topology::Sentinel(master) => LockClient::builder_sentinel(urls, master),
    };
    let locks = settings.apply(builder).build().await?;
    let outcome = run_on(&locks, command).await;
    // Before the process exits: what a wait that gave up left queued is given back, so no
    // lock is granted to this process once it is gone.
    locks.shutdown().await;
    outcome
}
