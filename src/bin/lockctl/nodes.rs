//! The nodes of a cluster as `stranded` reaches them: `CLUSTER NODES` read (each node's id,
//! address, role and slots, and the slots a node has open, which it shows on its own line
//! only: `[slot->-id]` MIGRATING to, `[slot-<-id]` IMPORTING from the node `id`), and a
//! connection to each made with the seed URL's credentials and TLS.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, Client, ClientTlsConfig, ConnectionAddr, ConnectionInfo, ErrorKind,
    RedisError, RedisResult, TlsCertificates,
};

use crate::servers::Settings;

/// How long a node may take to accept a connection, and to answer a command (a pipeline of
/// a thousand `COUNTKEYSINSLOT` is one answer).
const NODE_TIMEOUT: Duration = Duration::from_secs(10);

/// Slots of a Redis Cluster.
pub(crate) const SLOTS: u16 = 16384;

/// One line of `CLUSTER NODES`:
/// `<id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch> <link> <slot>…`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeLine {
    pub(crate) id: String,
    ip: String,
    /// The name the node announces (`cluster-announce-hostname`), if any.
    hostname: Option<String>,
    pub(crate) port: u16,
    flags: Vec<String>,
    /// The slots it serves, as inclusive ranges.
    ranges: Vec<(u16, u16)>,
    /// The slots it has MIGRATING or IMPORTING (on a node's own line only).
    pub(crate) open: Vec<u16>,
}

impl NodeLine {
    fn has(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    /// A master with an address, past the handshake: a node of the cluster that may hold
    /// keys. A failing one is kept: asking it is how lockctl learns it cannot be checked.
    pub(crate) fn is_reachable_master(&self) -> bool {
        self.has("master") && !self.has("noaddr") && !self.has("handshake") && self.port != 0
    }

    /// Whether it says it serves `slot`.
    pub(crate) fn serves(&self, slot: u16) -> bool {
        self.ranges
            .iter()
            .any(|(first, last)| (*first..=*last).contains(&slot))
    }

    /// The host clients reach it on: its IP, as `redis-cli --cluster` uses it; the name it
    /// announces when it shows no IP.
    pub(crate) fn host(&self) -> &str {
        match &self.hostname {
            Some(name) if self.ip.is_empty() => name,
            _ => &self.ip,
        }
    }

    /// `host:port`, `[v6]:port` for an IPv6 address.
    pub(crate) fn address(&self) -> String {
        if self.host().contains(':') {
            format!("[{}]:{}", self.host(), self.port)
        } else {
            format!("{}:{}", self.host(), self.port)
        }
    }
}

/// Every line of a `CLUSTER NODES` reply.
pub(crate) fn parse_nodes(reply: &str) -> Result<Vec<NodeLine>, RedisError> {
    reply
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            parse_line(line)
                .ok_or_else(|| unreadable("unreadable CLUSTER NODES line", line.to_owned()))
        })
        .collect()
}

/// The line of the node that answered (`myself`).
pub(crate) fn myself(reply: &str) -> Result<NodeLine, RedisError> {
    parse_nodes(reply)?
        .into_iter()
        .find(|line| line.has("myself"))
        .ok_or_else(|| unreadable("CLUSTER NODES without myself", reply.to_owned()))
}

fn parse_line(line: &str) -> Option<NodeLine> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let (id, address, flags) = (fields.first()?, fields.get(1)?, fields.get(2)?);
    let (endpoint, hostname) = match address.split_once(',') {
        Some((endpoint, rest)) => (endpoint, rest.split(',').next()),
        None => (*address, None),
    };
    let client = endpoint.split('@').next()?;
    let (ip, port) = client.rsplit_once(':')?;
    let mut node = NodeLine {
        id: (*id).to_owned(),
        ip: ip.trim_start_matches('[').trim_end_matches(']').to_owned(),
        hostname: hostname.filter(|name| !name.is_empty()).map(str::to_owned),
        port: port.parse().ok()?,
        flags: flags.split(',').map(str::to_owned).collect(),
        ranges: Vec::new(),
        open: Vec::new(),
    };
    for field in fields.iter().skip(8) {
        if let Some(open) = field.strip_prefix('[') {
            // `[slot->-id]` or `[slot-<-id]`.
            let slot = open.split('-').next()?.parse().ok()?;
            node.open.push(slot);
        } else if let Some((first, last)) = field.split_once('-') {
            node.ranges.push((first.parse().ok()?, last.parse().ok()?));
        } else {
            let slot = field.parse().ok()?;
            node.ranges.push((slot, slot));
        }
    }
    Some(node)
}

/// A client of the node at `host:port` (`None`: the seed itself), with the seed URL's
/// credentials, protocol and TLS (a `rediss://` seed means TLS to every node, checked against
/// `--tls-ca`, with `--tls-cert`'s identity), as the library's cluster client uses them.
pub(crate) fn client_for(
    seed: &ConnectionInfo,
    node: Option<(&str, u16)>,
    settings: &Settings,
) -> RedisResult<Client> {
    let tls = matches!(seed.addr(), ConnectionAddr::TcpTls { .. });
    let info = match (node, seed.addr()) {
        (None, _) => seed.clone(),
        (Some((host, port)), ConnectionAddr::TcpTls { insecure, .. }) => {
            seed.clone().set_addr(ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure: *insecure,
                tls_params: None,
            })
        }
        (Some((host, port)), _) => seed
            .clone()
            .set_addr(ConnectionAddr::Tcp(host.to_owned(), port)),
    };
    if !tls {
        return Client::open(info);
    }
    // redis-rs takes rustls's process-wide provider; the probe of the seed installed the
    // library's (ring), and this keeps it so should that ever change.
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    if settings.tls_ca.is_none() && settings.tls_client.is_none() {
        return Client::open(info);
    }
    Client::build_with_tls(
        info,
        TlsCertificates {
            client_tls: settings
                .tls_client
                .clone()
                .map(|(client_cert, client_key)| ClientTlsConfig {
                    client_cert,
                    client_key,
                }),
            root_cert: settings.tls_ca.clone(),
        },
    )
}

/// A connection of `client`'s, bounded in time: a node that does not answer is reported as
/// unchecked rather than waited for.
pub(crate) async fn connect(client: Client) -> RedisResult<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(NODE_TIMEOUT))
        .set_response_timeout(Some(NODE_TIMEOUT));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

/// `CLUSTER NODES` as the node on `conn` sees the cluster.
pub(crate) async fn cluster_nodes(conn: &mut MultiplexedConnection) -> RedisResult<String> {
    redis::cmd("CLUSTER").arg("NODES").query_async(conn).await
}

/// A reply lockctl cannot read, as a Redis error.
fn unreadable(what: &'static str, detail: String) -> RedisError {
    RedisError::from((ErrorKind::Parse, what, detail))
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPLY: &str = "\
07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@31004,node-4 slave e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected
67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.1:30002@31002 master - 0 1426238316232 2 connected 5461-10922
e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5460 12000 [5461-<-67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1] [77->-292f8b365bb7edb5e285caf0b7e6ddc7265a2f4f]
6ec23923021cf3ffec47632106199cb7f496ce01 :0@0 master,noaddr - 0 0 0 disconnected
";

    #[test]
    fn lines_give_roles_slots_and_the_slots_a_node_has_open() {
        let nodes = parse_nodes(REPLY).unwrap();
        assert_eq!(nodes.len(), 4);
        let masters: Vec<String> = nodes
            .iter()
            .filter(|node| node.is_reachable_master())
            .map(NodeLine::address)
            .collect();
        assert_eq!(masters, ["127.0.0.1:30002", "127.0.0.1:30001"]);
        let me = myself(REPLY).unwrap();
        assert_eq!(me.id, "e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca");
        assert!(me.serves(0) && me.serves(5460) && me.serves(12000));
        assert!(!me.serves(5461) && !me.serves(11999));
        assert_eq!(me.open, [5461, 77]);
        assert!(nodes[1].open.is_empty() && nodes[1].serves(10922));
        assert_eq!(nodes[0].hostname.as_deref(), Some("node-4"));
        assert_eq!(nodes[0].host(), "127.0.0.1");
    }

    #[test]
    fn an_unreadable_line_is_an_error_not_a_node_without_slots() {
        assert!(parse_nodes("abc 127.0.0.1:1@2 master - 0 0 1 connected 5-x\n").is_err());
        assert!(parse_nodes("abc nowhere master\n").is_err());
        assert!(myself("").is_err());
    }
}
