//! A TCP proxy between clients and Redis that injects network faults: cut every
//! connection, cut only pub/sub connections, black-hole traffic for a while (all of it, or
//! only what Redis sends to pub/sub connections), add latency.
//!
//! It runs in the test's own Tokio runtime. A black hole stalls bytes instead of dropping
//! them, as TCP does by retransmitting: when it heals, what was sent arrives, late.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A fault-injecting proxy in front of the Redis on `127.0.0.1:<upstream port>`.
#[derive(Debug)]
pub struct FaultProxy {
    port: u16,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

#[derive(Debug)]
struct Shared {
    upstream: u16,
    /// `true` while traffic is black-holed.
    black_hole: watch::Sender<bool>,
    /// `true` while what Redis sends to connections that subscribed is held back.
    pubsub_hole: watch::Sender<bool>,
    /// Added to every chunk of bytes in both directions.
    latency_us: AtomicU64,
    connections: Mutex<HashMap<u64, Connection>>,
    next_id: AtomicU64,
}

#[derive(Debug)]
struct Connection {
    /// Set once the client sent a SUBSCRIBE of some kind.
    pubsub: Arc<AtomicBool>,
    cut: watch::Sender<bool>,
}

impl FaultProxy {
    /// Listens on a free port of 127.0.0.1 and forwards to `upstream_port`.
    pub async fn start(upstream_port: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy port");
        let port = listener.local_addr().expect("proxy address").port();
        let shared = Arc::new(Shared {
            upstream: upstream_port,
            black_hole: watch::channel(false).0,
            pubsub_hole: watch::channel(false).0,
            latency_us: AtomicU64::new(0),
            connections: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        Self {
            port,
            shared,
            accept,
        }
    }

    /// The port clients reach Redis through.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL clients use to reach Redis through the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Closes every connection open now; new ones are accepted as before.
    pub fn cut_all(&self) -> usize {
        self.cut_where(|_| true)
    }

    /// Closes only the connections that subscribed to something.
    pub fn cut_pubsub(&self) -> usize {
        self.cut_where(|connection| connection.pubsub.load(Ordering::SeqCst))
    }

    /// Stalls all traffic, and new connections, until [`FaultProxy::heal`].
    pub fn black_hole(&self) {
        self.shared.black_hole.send_replace(true);
    }

    /// Ends a black hole: stalled bytes and connections go through.
    pub fn heal(&self) {
        self.shared.black_hole.send_replace(false);
    }

    /// Holds back what Redis sends to connections that subscribed to something (messages
    /// published meanwhile arrive late), until [`FaultProxy::release_pubsub`]; commands on
    /// other connections go through.
    pub fn hold_pubsub(&self) {
        self.shared.pubsub_hole.send_replace(true);
    }

    /// Lets what [`FaultProxy::hold_pubsub`] held back go through.
    pub fn release_pubsub(&self) {
        self.shared.pubsub_hole.send_replace(false);
    }

    /// How many connections open now subscribed to something.
    pub fn subscribed_connections(&self) -> usize {
        let connections = self.shared.connections.lock().expect("proxy table");
        connections
            .values()
            .filter(|connection| connection.pubsub.load(Ordering::SeqCst))
            .count()
    }

    /// Delays every chunk of bytes by `latency` in each direction (zero to stop).
    pub fn set_latency(&self, latency: Duration) {
        self.shared
            .latency_us
            .store(latency.as_micros() as u64, Ordering::SeqCst);
    }

    /// Connections open through the proxy now.
    pub fn open_connections(&self) -> usize {
        self.shared.connections.lock().expect("proxy table").len()
    }

    fn cut_where(&self, select: impl Fn(&Connection) -> bool) -> usize {
        let mut connections = self.shared.connections.lock().expect("proxy table");
        let mut cut = 0;
        connections.retain(|_, connection| {
            if select(connection) {
                connection.cut.send_replace(true);
                cut += 1;
                false
            } else {
                true
            }
        });
        cut
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut_all();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let pubsub = Arc::new(AtomicBool::new(false));
        let (cut, cut_seen) = watch::channel(false);
        shared.connections.lock().expect("proxy table").insert(
            id,
            Connection {
                pubsub: pubsub.clone(),
                cut,
            },
        );
        tokio::spawn(serve(client, shared.clone(), id, pubsub, cut_seen));
    }
}

/// Connects `client` upstream (once no black hole stands in the way) and pumps both ways
/// until either side closes or the connection is cut.
async fn serve(
    client: TcpStream,
    shared: Arc<Shared>,
    id: u64,
    pubsub: Arc<AtomicBool>,
    mut cut: watch::Receiver<bool>,
) {
    let connected = async {
        pass_black_hole(&shared).await;
        TcpStream::connect(("127.0.0.1", shared.upstream)).await
    };
    let upstream = tokio::select! {
        upstream = connected => upstream,
        _ = cut.wait_for(|cut| *cut) => return,
    };
    if let Ok(upstream) = upstream {
        let _ = client.set_nodelay(true);
        let _ = upstream.set_nodelay(true);
        let (client_read, client_write) = client.into_split();
        let (upstream_read, upstream_write) = upstream.into_split();
        let to_server = pump(
            client_read,
            upstream_write,
            &shared,
            Direction::ToServer,
            &pubsub,
        );
        let to_client = pump(
            upstream_read,
            client_write,
            &shared,
            Direction::ToClient,
            &pubsub,
        );
        tokio::select! {
            _ = to_server => {}
            _ = to_client => {}
            _ = cut.wait_for(|cut| *cut) => {}
        }
    }
    shared.connections.lock().expect("proxy table").remove(&id);
}

/// Which way a pump carries bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    ToServer,
    ToClient,
}

/// Carries bytes one way; `pubsub` is set when the client subscribes, and what goes to such
/// a client waits out a pub/sub hole.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    shared: &Shared,
    direction: Direction,
    pubsub: &AtomicBool,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        let chunk = &buffer[..read];
        if direction == Direction::ToServer && contains_subscribe(chunk) {
            pubsub.store(true, Ordering::SeqCst);
        }
        let latency = shared.latency_us.load(Ordering::SeqCst);
        if latency > 0 {
            tokio::time::sleep(Duration::from_micros(latency)).await;
        }
        pass_black_hole(shared).await;
        if direction == Direction::ToClient && pubsub.load(Ordering::SeqCst) {
            let mut hole = shared.pubsub_hole.subscribe();
            let _ = hole.wait_for(|on| !*on).await;
        }
        if to.write_all(chunk).await.is_err() {
            return;
        }
    }
}

async fn pass_black_hole(shared: &Shared) {
    let mut black_hole = shared.black_hole.subscribe();
    let _ = black_hole.wait_for(|on| !*on).await;
}

/// Whether a chunk a client sent holds a SUBSCRIBE, PSUBSCRIBE or SSUBSCRIBE command.
fn contains_subscribe(chunk: &[u8]) -> bool {
    chunk
        .windows(b"SUBSCRIBE".len())
        .any(|window| window.eq_ignore_ascii_case(b"SUBSCRIBE"))
}
