//! `lockctl`: see who holds which lock and who waits, watch them live, hold and force-unlock
//! locks from a shell.
//!
//! ```text
//! lockctl [--url URL] list [PATTERN] [--limit N] [--cursor C] [--json]
//! lockctl [--url URL] inspect NAME [--kind semaphore] [--json]
//! lockctl [--url URL] watch [PATTERN] [--interval 1s] [--count N] [--limit N] [--json]
//! lockctl [--url URL] force-unlock NAME [--kind semaphore] [--yes] [--json]
//! lockctl [--url URL] hold NAME --for 2s [--lease 5s | --watchdog-lease 30s] [--wait 10s]
//!                     [--kind KIND]
//! lockctl [--url URL] hold NAME --for 2s --kind semaphore --permits N [--take K]
//! lockctl --url URL1 --url URL2 --url URL3 hold NAME --for 2s --kind redlock
//! lockctl [--url URL] waive-quarantine
//! lockctl --cluster --url SEED [--url SEED ...] COMMAND ...
//! lockctl --sentinel MASTER --url SENTINEL [--url SENTINEL ...] COMMAND ...
//! ```
//!
//! `list`, `inspect` and `watch` print tables (`watch` redraws one on a terminal, and prints
//! one `key=value` line per lock otherwise); `--json` prints one JSON object per line. `hold`
//! and `waive-quarantine` print one JSON line per event. KIND is `exclusive` (the default),
//! `fair`, `read`, `write`, `semaphore` (`--take` of its `--permits`, default 1) or `redlock`
//! (a quorum of the servers named by several `--url`). `list` and `watch` show locks and
//! semaphores together; `inspect` and `force-unlock` name a lock unless `--kind semaphore`
//! says the semaphore of that name (its keys are apart from the lock's). `hold` keeps its
//! lease with the watchdog (`--watchdog-lease`, default 30 s, renewed every third of it)
//! unless `--lease` fixes it.
//! With `--cluster`, the URLs are seeds of one Redis Cluster; with `--sentinel MASTER`, they
//! are the sentinels that name that master; `--prefix` is the clients' key prefix and
//! `--instance-name` names lockctl's own instance (what others see holding or waiting).
//! A `rediss://` URL is checked against the system's roots unless `--tls-ca FILE` names the
//! CA (PEM) to trust; `--tls-cert FILE --tls-key FILE` present a client certificate to a
//! server that asks for one. A password goes in the URL (`rediss://user:password@host`).
//! Exit codes: 0 done, 1 error (or a force-unlock answered no), 2 usage (or a force-unlock
//! without a terminal to ask on and without `--yes`), 3 wait timed out, 4 lease lost while
//! holding. The URL defaults to `$REDIS_URL`, else `redis://127.0.0.1:6379`.

mod operate;
mod show;

use std::future::Future;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::json;
use tower_redis_lock::{
    ErrorKind, Lease, Lock, LockClient, LockClientBuilder, LockError, LostSignal, RedLock,
    Semaphore,
};

use crate::operate::Watch;
use crate::show::millis;

const USAGE: &str = "usage: lockctl [--url URL] list [PATTERN] [--limit N] [--cursor C] [--json]
       lockctl [--url URL] inspect NAME [--kind semaphore] [--json]
       lockctl [--url URL] watch [PATTERN] [--interval DURATION] [--count N] [--limit N] [--json]
       lockctl [--url URL] force-unlock NAME [--kind semaphore] [--yes] [--json]
       lockctl [--url URL] hold NAME --for DURATION [--lease DURATION | --watchdog-lease DURATION]
                      [--wait DURATION] [--kind exclusive|fair|read|write|redlock]
       lockctl [--url URL] hold NAME --for DURATION --kind semaphore --permits N [--take K]
       lockctl --url URL --url URL ... hold NAME --for DURATION --kind redlock
       lockctl [--url URL] waive-quarantine
       lockctl --cluster --url SEED [--url SEED ...] COMMAND ...
       lockctl --sentinel MASTER --url SENTINEL [--url SENTINEL ...] COMMAND ...
options: --prefix PREFIX (the key prefix, default lock:), --instance-name NAME (lockctl's own,
         as holders and waiters show it), --tls-ca FILE (the CA a rediss:// server's
         certificate is checked against), --tls-cert FILE --tls-key FILE (a client
         certificate, PEM); PATTERN is a glob (tenant:*)
durations: 250ms, 2s, 1m (a bare number is seconds)";

/// Locks a page of `list` or `watch` shows unless `--limit` says otherwise.
const DEFAULT_LIMIT: usize = 100;

/// Which kind of lock `hold` takes (and, for `inspect` and `force-unlock`, whether NAME is a
/// semaphore's).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Exclusive,
    Fair,
    Read,
    Write,
    RedLock,
    /// `take` of a semaphore's `permits`.
    Semaphore {
        permits: u32,
        take: u32,
    },
}

impl Kind {
    fn is_semaphore(self) -> bool {
        matches!(self, Self::Semaphore { .. })
    }
}

/// Which Redis the URLs name.
enum Topology {
    /// One server (or, for `--kind redlock`, independent servers).
    Servers,
    /// Seeds of one Redis Cluster.
    Cluster,
    /// Sentinels, and the name of the master they watch.
    Sentinel(String),
}

enum Command {
    Hold {
        name: String,
        hold_for: Duration,
        lease: Option<Duration>,
        wait: Option<Duration>,
        kind: Kind,
    },
    Inspect {
        name: String,
        semaphore: bool,
        json: bool,
    },
    List {
        pattern: Option<String>,
        cursor: Option<String>,
        limit: usize,
        json: bool,
    },
    Watch(Watch),
    ForceUnlock {
        name: String,
        semaphore: bool,
        yes: bool,
        json: bool,
    },
    /// The server is new, or every holder of a lock it lost has stopped: no quarantine.
    WaiveQuarantine,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let (urls, topology, settings, command) = match parse(std::env::args().skip(1).collect()) {
        Ok(parsed) => parsed,
        Err(problem) => {
            eprintln!("lockctl: {problem}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if let Command::ForceUnlock {
        name, yes: false, ..
    } = &command
        && !operate::can_confirm()
    {
        eprintln!(
            "lockctl: force-unlock {name} asks for confirmation, and stdin is not a terminal: \
             pass --yes to unlock without asking; nothing was changed"
        );
        return ExitCode::from(2);
    }
    let json_errors = match &command {
        Command::Hold { .. } | Command::WaiveQuarantine => true,
        Command::Inspect { json, .. }
        | Command::List { json, .. }
        | Command::ForceUnlock { json, .. } => *json,
        Command::Watch(watch) => watch.json,
    };
    match run(&urls, &topology, &settings, command).await {
        Ok(code) => code,
        Err(err) if json_errors => {
            emit(
                json!({"event": "error", "kind": format!("{:?}", err.kind()), "message": err.to_string()}),
            );
            ExitCode::from(1)
        }
        Err(err) => {
            eprintln!("lockctl: {err}");
            ExitCode::from(1)
        }
    }
}

/// The settings of lockctl's clients the options ask for.
#[derive(Default)]
struct Settings {
    prefix: Option<String>,
    instance_name: Option<String>,
    /// `hold --watchdog-lease`: how long a held lock outlives a lockctl that stops renewing
    /// it (killed, or cut off from Redis).
    watchdog_lease: Option<Duration>,
    /// `--tls-ca`: the CA certificate (PEM) a `rediss://` server's certificate must chain to.
    tls_ca: Option<Vec<u8>>,
    /// `--tls-cert` and `--tls-key`: a client certificate and its key (PEM).
    tls_client: Option<(Vec<u8>, Vec<u8>)>,
}

impl Settings {
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

async fn run(
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

/// Runs `command` (any but a quorum lock's hold) with `locks`.
async fn run_on(locks: &LockClient, command: Command) -> Result<ExitCode, LockError> {
    match command {
        Command::Hold {
            name,
            hold_for,
            lease,
            wait,
            kind,
        } => {
            let lock = match kind {
                Kind::Semaphore { permits, take } => {
                    let semaphore = locks.semaphore(&name, permits)?;
                    let semaphore = semaphore.with_lease(lease_of(lease));
                    return hold_semaphore(semaphore, take, hold_for, wait).await;
                }
                Kind::Fair => locks.fair_lock(&name)?,
                Kind::Read => locks.read_write_lock(&name)?.read(),
                Kind::Write => locks.read_write_lock(&name)?.write(),
                Kind::Exclusive | Kind::RedLock => locks.lock(&name)?,
            };
            hold(lock.with_lease(lease_of(lease)), hold_for, wait).await
        }
        Command::Inspect {
            name,
            semaphore,
            json,
        } => operate::inspect(locks, &name, semaphore, json).await,
        Command::List {
            pattern,
            cursor,
            limit,
            json,
        } => operate::list(locks, pattern.as_deref(), cursor.as_deref(), limit, json).await,
        Command::Watch(watch) => operate::watch(locks, watch).await,
        Command::ForceUnlock {
            name,
            semaphore,
            yes,
            json,
        } => operate::force_unlock(locks, &name, semaphore, yes, json).await,
        Command::WaiveQuarantine => {
            let waived = locks.waive_restart_quarantine().await?;
            emit(json!({"event": "quarantine-waived", "waived": waived}));
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn lease_of(lease: Option<Duration>) -> Lease {
    lease.map_or(Lease::Watchdog, Lease::Fixed)
}

/// The guard, or `None` once a wait that timed out is reported (exit code 3).
fn unless_timed_out<G>(
    acquired: Result<G, LockError>,
    name: &str,
    started: Instant,
) -> Result<Option<G>, LockError> {
    match acquired {
        Ok(guard) => Ok(Some(guard)),
        Err(err) if err.kind() == ErrorKind::Timeout => {
            emit(json!({"event": "timeout", "name": name, "waited_ms": millis(started.elapsed())}));
            Ok(None)
        }
        Err(err) => Err(err),
    }
}

async fn hold(
    lock: Lock,
    hold_for: Duration,
    wait: Option<Duration>,
) -> Result<ExitCode, LockError> {
    let name = lock.name().to_owned();
    let started = Instant::now();
    let acquired = match wait {
        Some(wait) => lock.acquire_timeout(wait).await,
        None => lock.acquire().await,
    };
    let Some(guard) = unless_timed_out(acquired, &name, started)? else {
        return Ok(ExitCode::from(3));
    };
    let token = guard.fencing_token();
    emit(json!({
        "event": "acquired",
        "name": name,
        "kind": format!("{:?}", lock.kind()),
        "token": token,
        "waited_ms": millis(started.elapsed()),
        "pid": std::process::id(),
        "owner": guard.owner_id(),
    }));
    let lost = guard.lost_signal();
    keep_until(&name, json!(token), hold_for, lost, guard.release()).await
}

/// `hold --kind semaphore`: takes `take` of the semaphore's permits, and keeps them as `hold`
/// keeps a lock.
async fn hold_semaphore(
    semaphore: Semaphore,
    take: u32,
    hold_for: Duration,
    wait: Option<Duration>,
) -> Result<ExitCode, LockError> {
    let name = semaphore.name().to_owned();
    let started = Instant::now();
    let acquired = match wait {
        Some(wait) => semaphore.acquire_many_timeout(take, wait).await,
        None => semaphore.acquire_many(take).await,
    };
    let Some(guard) = unless_timed_out(acquired, &name, started)? else {
        return Ok(ExitCode::from(3));
    };
    let token = guard.fencing_token();
    emit(json!({
        "event": "acquired",
        "name": name,
        "kind": "Semaphore",
        "permits": semaphore.permits(),
        "take": guard.permits(),
        "token": token,
        "waited_ms": millis(started.elapsed()),
        "pid": std::process::id(),
        "owner": guard.owner_id(),
    }));
    let lost = guard.lost_signal();
    keep_until(&name, json!(token), hold_for, lost, guard.release()).await
}

async fn hold_redlock(
    lock: RedLock,
    hold_for: Duration,
    wait: Option<Duration>,
) -> Result<ExitCode, LockError> {
    let name = lock.name().to_owned();
    let started = Instant::now();
    let acquired = match wait {
        Some(wait) => lock.acquire_timeout(wait).await,
        None => lock.acquire().await,
    };
    let Some(guard) = unless_timed_out(acquired, &name, started)? else {
        return Ok(ExitCode::from(3));
    };
    let tokens = json!(guard.fencing_tokens());
    emit(json!({
        "event": "acquired",
        "name": name,
        "kind": "RedLock",
        "tokens": tokens,
        "held_on": guard.held_on(),
        "servers": lock.servers(),
        "validity_ms": millis(guard.validity().saturating_duration_since(Instant::now())),
        "waited_ms": millis(started.elapsed()),
        "pid": std::process::id(),
    }));
    let lost = guard.lost_signal();
    keep_until(&name, tokens, hold_for, lost, guard.release()).await
}

/// Holds for `hold_for` and then releases, unless the lease is lost first (exit code 4).
async fn keep_until(
    name: &str,
    token: serde_json::Value,
    hold_for: Duration,
    lost: LostSignal,
    release: impl Future<Output = Result<(), LockError>>,
) -> Result<ExitCode, LockError> {
    let held_since = Instant::now();
    tokio::select! {
        () = tokio::time::sleep(hold_for) => {
            release.await?;
            emit(json!({"event": "released", "name": name, "token": token, "held_ms": millis(held_since.elapsed()), "pid": std::process::id()}));
            Ok(ExitCode::SUCCESS)
        }
        reason = lost.lost() => {
            emit(json!({"event": "lost", "name": name, "token": token, "reason": format!("{reason:?}"), "held_ms": millis(held_since.elapsed()), "pid": std::process::id()}));
            Ok(ExitCode::from(4))
        }
    }
}

/// What `parse` finds: the URLs, what they are, the clients' settings and the command.
type Parsed = (Vec<String>, Topology, Settings, Command);

/// The options each command takes, besides the global `--url`, `--cluster`, `--sentinel`,
/// `--prefix`, `--instance-name` and the `--tls-*` files.
fn options_of(verb: &str) -> &'static [&'static str] {
    match verb {
        "hold" => &[
            "--for",
            "--lease",
            "--watchdog-lease",
            "--wait",
            "--kind",
            "--permits",
            "--take",
        ],
        "list" => &["--limit", "--cursor", "--json"],
        "inspect" => &["--kind", "--json"],
        "watch" => &["--interval", "--count", "--limit", "--json"],
        "force-unlock" => &["--kind", "--yes", "--json"],
        _ => &[],
    }
}

fn parse(args: Vec<String>) -> Result<Parsed, String> {
    let mut urls = Vec::new();
    let mut topology = Topology::Servers;
    let mut settings = Settings::default();
    let mut positional = Vec::new();
    let mut given = Vec::new();
    let (mut hold_for, mut lease, mut wait) = (None, None, None);
    let mut kind = Kind::Exclusive;
    let (mut permits, mut take) = (None, None);
    let (mut json, mut yes) = (false, false);
    let (mut limit, mut cursor) = (DEFAULT_LIMIT, None);
    let (mut interval, mut count) = (Duration::from_secs(1), None);
    let (mut tls_cert, mut tls_key) = (None, None);
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--url" => urls.push(value()?),
            "--cluster" => topology = Topology::Cluster,
            "--sentinel" => topology = Topology::Sentinel(value()?),
            "--prefix" => settings.prefix = Some(value()?),
            "--instance-name" => settings.instance_name = Some(value()?),
            "--tls-ca" => settings.tls_ca = Some(pem_file(&value()?)?),
            "--tls-cert" => tls_cert = Some(pem_file(&value()?)?),
            "--tls-key" => tls_key = Some(pem_file(&value()?)?),
            "--for" => hold_for = Some(duration(&value()?)?),
            "--lease" => lease = Some(duration(&value()?)?),
            "--watchdog-lease" => settings.watchdog_lease = Some(duration(&value()?)?),
            "--wait" => wait = Some(duration(&value()?)?),
            "--kind" => kind = lock_kind(&value()?)?,
            "--permits" => permits = Some(number::<u32>(&value()?)?),
            "--take" => take = Some(number::<u32>(&value()?)?),
            "--json" => json = true,
            "--yes" | "-y" => yes = true,
            "--limit" => limit = number(&value()?)?,
            "--cursor" => cursor = Some(value()?),
            "--interval" => interval = duration(&value()?)?,
            "--count" => count = Some(number(&value()?)?),
            "-h" | "--help" => return Err("help".into()),
            flag if flag.starts_with("--") => return Err(format!("unknown option {flag}")),
            _ => {
                positional.push(arg);
                continue;
            }
        }
        given.push(if arg == "-y" { "--yes".to_owned() } else { arg });
    }
    let verb = positional.first().map_or("", String::as_str);
    let global = [
        "--url",
        "--cluster",
        "--sentinel",
        "--prefix",
        "--instance-name",
        "--tls-ca",
        "--tls-cert",
        "--tls-key",
    ];
    if let Some(flag) = given
        .iter()
        .find(|flag| !global.contains(&flag.as_str()) && !options_of(verb).contains(&flag.as_str()))
    {
        return Err(format!("{flag} is not an option of {verb:?}"));
    }
    settings.tls_client = match (tls_cert, tls_key) {
        (Some(certificate), Some(key)) => Some((certificate, key)),
        (None, None) => None,
        _ => return Err("--tls-cert and --tls-key go together".into()),
    };
    if interval.is_zero() || count == Some(0) || limit == 0 {
        return Err("--interval, --count and --limit must be above 0".into());
    }
    if lease.is_some() && settings.watchdog_lease.is_some() {
        return Err(
            "--lease fixes the lease: the watchdog's (--watchdog-lease) is not used".into(),
        );
    }
    if kind.is_semaphore() && verb == "hold" {
        let permits = permits.ok_or("hold --kind semaphore needs --permits")?;
        kind = Kind::Semaphore {
            permits,
            take: take.unwrap_or(1),
        };
    } else if permits.is_some() || take.is_some() {
        return Err("--permits and --take are for hold --kind semaphore".into());
    }
    if verb != "hold" && !matches!(kind, Kind::Exclusive | Kind::Semaphore { .. }) {
        return Err(format!(
            "{verb} takes --kind semaphore, or no --kind for a lock of any other kind"
        ));
    }
    let command = match positional.as_slice() {
        [verb, name] if verb == "hold" => Command::Hold {
            name: name.clone(),
            hold_for: hold_for.ok_or("hold needs --for")?,
            lease,
            wait,
            kind,
        },
        [verb, name] if verb == "inspect" => Command::Inspect {
            name: name.clone(),
            semaphore: kind.is_semaphore(),
            json,
        },
        [verb, pattern @ ..] if verb == "list" && pattern.len() <= 1 => Command::List {
            pattern: pattern.first().cloned(),
            cursor,
            limit,
            json,
        },
        [verb, pattern @ ..] if verb == "watch" && pattern.len() <= 1 => Command::Watch(Watch {
            pattern: pattern.first().cloned(),
            limit,
            interval,
            count,
            json,
        }),
        [verb, name] if verb == "force-unlock" => Command::ForceUnlock {
            name: name.clone(),
            semaphore: kind.is_semaphore(),
            yes,
            json,
        },
        [verb] if verb == "waive-quarantine" => Command::WaiveQuarantine,
        _ => return Err("expected a command and its arguments".into()),
    };
    let redlock = matches!(
        command,
        Command::Hold {
            kind: Kind::RedLock,
            ..
        }
    );
    match topology {
        Topology::Servers if urls.len() > 1 && !redlock => {
            return Err("several --url are for --kind redlock, --cluster or --sentinel".into());
        }
        Topology::Cluster | Topology::Sentinel(_) if redlock => {
            return Err(
                "--kind redlock takes independent servers, not --cluster or --sentinel".into(),
            );
        }
        Topology::Cluster | Topology::Sentinel(_) if urls.is_empty() => {
            return Err("--cluster and --sentinel need at least one --url".into());
        }
        _ => {}
    }
    if urls.is_empty() {
        urls.push(std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into()));
    }
    Ok((urls, topology, settings, command))
}

/// The contents of a PEM file named on the command line.
fn pem_file(path: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|err| format!("cannot read {path}: {err}"))
}

fn number<T: std::str::FromStr>(text: &str) -> Result<T, String> {
    text.parse().map_err(|_| format!("bad number {text:?}"))
}

fn lock_kind(text: &str) -> Result<Kind, String> {
    match text {
        "exclusive" => Ok(Kind::Exclusive),
        "fair" => Ok(Kind::Fair),
        "read" => Ok(Kind::Read),
        "write" => Ok(Kind::Write),
        "redlock" => Ok(Kind::RedLock),
        // Its permits come from --permits and --take.
        "semaphore" => Ok(Kind::Semaphore {
            permits: 0,
            take: 0,
        }),
        _ => Err(format!("unknown lock kind {text:?}")),
    }
}

fn duration(text: &str) -> Result<Duration, String> {
    let (number, unit) = text.split_at(
        text.find(|c: char| c.is_ascii_alphabetic())
            .unwrap_or(text.len()),
    );
    let number: f64 = number
        .parse()
        .map_err(|_| format!("bad duration {text:?}"))?;
    let seconds = match unit {
        "ms" => number / 1000.0,
        "" | "s" => number,
        "m" => number * 60.0,
        _ => return Err(format!("bad duration unit in {text:?}")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|_| format!("bad duration {text:?}"))
}

fn emit(event: serde_json::Value) {
    println!("{event}");
}
