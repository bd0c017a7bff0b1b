//! The command line: the global options (which Redis, the clients' settings), the command
//! and the options it takes, checked together so that a mistake is a usage error before any
//! connection is made (but for several plain `--url`, which are a cluster's seeds when the
//! first is a node of one: see `connect::settle`).

use std::time::Duration;

use crate::operate::Watch;
use crate::servers::{Settings, Topology};
use crate::stranded::Stranded;

/// What `parse` answers for `-h` and `--help`: the usage, on stdout, and exit 0.
pub(crate) const HELP: &str = "help";

/// Printed after every usage error, so a mistake shows the right form.
pub(crate) const USAGE: &str =
    "usage: lockctl [--url URL] list [PATTERN] [--limit N] [--cursor C] [--json]
       lockctl [--url URL] inspect NAME [--kind semaphore] [--json]
       lockctl [--url URL] watch [PATTERN] [--interval DURATION] [--count N] [--limit N] [--json]
       lockctl [--url URL] force-unlock NAME [--kind semaphore] [--yes] [--json]
       lockctl [--url URL] hold NAME --for DURATION [--lease DURATION | --watchdog-lease DURATION]
                      [--wait DURATION] [--kind exclusive|fair|read|write|redlock]
       lockctl [--url URL] hold NAME --for DURATION --kind semaphore --permits N [--take K]
       lockctl --url URL --url URL ... hold NAME --for DURATION --kind redlock
       lockctl [--url URL] waive-quarantine
       lockctl [--url URL] idempotent KEY [--scope PART ...] [--layer-prefix P] [--json]
       lockctl --cluster --url SEED stranded [--delete [--yes]] [--json]
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
pub(crate) enum Kind {
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

/// What lockctl is asked to do, with the options it takes already checked.
pub(crate) enum Command {
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
    /// The stored response of an idempotency key, in its scope, of the layers with a prefix.
    Idempotent {
        key: String,
        scope: Vec<String>,
        layer_prefix: String,
        json: bool,
    },
    /// The keys under the prefix on a cluster master that does not own their slot, left by
    /// an aborted migration; `--delete` removes them.
    Stranded(Stranded),
}

/// What `parse` finds: the URLs, what they are, the clients' settings and the command.
pub(crate) type Parsed = (Vec<String>, Topology, Settings, Command);

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
        "idempotent" => &["--scope", "--layer-prefix", "--json"],
        "stranded" => &["--delete", "--yes", "--json"],
        _ => &[],
    }
}

/// The URLs, what they are, the clients' settings and the command `args` ask for, or what
/// is wrong with them: every check is made here, before any connection.
pub(crate) fn parse(args: Vec<String>) -> Result<Parsed, String> {
    let mut urls = Vec::new();
    let mut topology = Topology::Servers;
    let mut settings = Settings::default();
    let mut positional = Vec::new();
    let mut given = Vec::new();
    let (mut hold_for, mut lease, mut wait) = (None, None, None);
    let mut kind = Kind::Exclusive;
    let (mut permits, mut take) = (None, None);
    let (mut json, mut yes, mut delete) = (false, false, false);
    let (mut limit, mut cursor) = (DEFAULT_LIMIT, None);
    let (mut interval, mut count) = (Duration::from_secs(1), None);
    let (mut tls_cert, mut tls_key) = (None, None);
    let (mut scope, mut layer_prefix) = (Vec::new(), String::new());
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
            "--delete" => delete = true,
            "--limit" => limit = number(&value()?)?,
            "--cursor" => cursor = Some(value()?),
            "--interval" => interval = duration(&value()?)?,
            "--count" => count = Some(number(&value()?)?),
            "--scope" => scope.push(value()?),
            "--layer-prefix" => layer_prefix = value()?,
            "-h" | "--help" => return Err(HELP.into()),
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
        [verb, key] if verb == "idempotent" => Command::Idempotent {
            key: key.clone(),
            // A layer's default scope: one for every request.
            scope: if scope.is_empty() {
                vec!["all".to_owned()]
            } else {
                scope
            },
            layer_prefix,
            json,
        },
        [verb] if verb == "stranded" => {
            if yes && !delete {
                return Err("stranded --yes is for --delete".into());
            }
            Command::Stranded(Stranded { delete, yes, json })
        }
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

/// A number option's value, or a usage error that quotes it.
fn number<T: std::str::FromStr>(text: &str) -> Result<T, String> {
    text.parse().map_err(|_| format!("bad number {text:?}"))
}

/// `--kind`'s value; a semaphore's permits come apart, from `--permits` and `--take`.
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

/// `250ms`, `2s`, `1m`, or a bare number of seconds, as the usage says.
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
