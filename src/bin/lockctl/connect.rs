//! The clients a command runs on: one for a server, a cluster or a sentinel-watched master,
//! or one per server for a quorum lock, each built with the settings the options ask for and
//! shut down before lockctl exits; `stranded` makes its own connections, to each master.

use std::process::ExitCode;

use tower_redis_lock::{LockClient, LockError, RedLock};

use crate::args::{Command, Kind};
use crate::dispatch::run_on;
use crate::hold::{hold_redlock, lease_of};
use crate::servers::{SEVERAL_URLS, Settings, Topology};
use crate::stranded;

/// What plain `--url`s (no `--cluster`, `--sentinel` or `--kind redlock`) name: the seeds of a
/// cluster when the first URL's server is a node of one (`INFO cluster`), so that an operator
/// pointing lockctl at any node sees and changes the whole cluster (a note on stderr says so;
/// stdout stays the command's); one server otherwise. Several URLs of no cluster are a usage
/// error, returned. A server that cannot be asked is taken as one server: the command then
/// meets what keeps it away, as before (and `hold --wait` rides out a server still down).
pub(crate) async fn settle(
    urls: &[String],
    topology: Topology,
    settings: &Settings,
    command: &Command,
) -> Result<Topology, String> {
    let redlock = matches!(
        command,
        Command::Hold {
            kind: Kind::RedLock,
            ..
        }
    );
    if !matches!(topology, Topology::Servers) || redlock {
        return Ok(topology);
    }
    let first = settings.apply(LockClient::builder(&urls[0]));
    if let Ok(true) = first.points_to_cluster_node().await {
        eprintln!(
            "note: {} is a Redis Cluster node; using cluster mode (pass --cluster to say so)",
            without_credentials(&urls[0])
        );
        return Ok(Topology::Cluster);
    }
    if urls.len() > 1 {
        return Err(SEVERAL_URLS.into());
    }
    Ok(Topology::Servers)
}

/// `url`'s scheme and host only (no user, password, database or options), for a message.
fn without_credentials(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    format!("{scheme}://{host}")
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
    // Not through a client: it reads each master of a cluster on a connection of its own.
    if let Command::Stranded(ask) = &command {
        return stranded::run(urls, topology, settings, ask).await;
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
