//! The command line, read by clap: the global options (which Redis, the clients' settings),
//! the command and the options it takes, checked together so that a mistake is a usage error
//! before any connection is made (but for several plain `--url`, which are a cluster's seeds
//! when the first is a node of one: see `connect::settle`). `lockctl --help` and
//! `lockctl COMMAND --help` say the rest.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};

use crate::operate::Watch;
use crate::servers::{Settings, Topology};
use crate::stranded::Stranded;

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

/// Why `parse` gives no command.
pub(crate) enum Refused {
    /// Help was asked for: the text, for stdout (exit 0).
    Help(String),
    /// A usage error: what is wrong, for stderr (exit 2).
    Usage(String),
}

/// See who holds which lock and who waits, watch them live, hold and force-unlock locks.
#[derive(Parser)]
#[command(
    name = "lockctl",
    after_help = "DURATION is 250ms, 2s or 1m (a bare number is seconds); PATTERN is a glob \
                  (tenant:*). Exit codes: 0 done, 1 error, 2 usage, 3 wait timed out, 4 lease \
                  lost while holding."
)]
struct Cli {
    #[command(flatten)]
    servers: ServerOptions,
    #[command(subcommand)]
    verb: Verb,
}

/// Which Redis, and the settings of lockctl's clients: given before or after the command.
#[derive(Args)]
struct ServerOptions {
    /// A Redis URL; several name a quorum's servers (--kind redlock), a cluster's seeds or the
    /// sentinels [default: $REDIS_URL, else redis://127.0.0.1:6379]
    #[arg(long = "url", value_name = "URL", global = true)]
    urls: Vec<String>,
    /// The URLs are seeds of one Redis Cluster
    #[arg(long, global = true)]
    cluster: bool,
    /// The URLs are sentinels that watch the master MASTER
    #[arg(long, value_name = "MASTER", global = true)]
    sentinel: Option<String>,
    /// The clients' key prefix [default: lock:]
    #[arg(long, global = true)]
    prefix: Option<String>,
    /// lockctl's own instance name, as holders and waiters show it
    #[arg(long, value_name = "NAME", global = true)]
    instance_name: Option<String>,
    /// The CA (PEM) a rediss:// server's certificate is checked against
    #[arg(long, value_name = "FILE", global = true)]
    tls_ca: Option<PathBuf>,
    /// A client certificate (PEM), with --tls-key
    #[arg(long, value_name = "FILE", global = true)]
    tls_cert: Option<PathBuf>,
    /// The client certificate's key (PEM), with --tls-cert
    #[arg(long, value_name = "FILE", global = true)]
    tls_key: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Verb {
    /// The locks and semaphores under the prefix, a page at a time
    List {
        pattern: Option<String>,
        #[arg(long, default_value_t = 100, value_parser = at_least_one)]
        limit: usize,
        /// Where the previous page ended
        #[arg(long)]
        cursor: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// One lock: its holders, its waiters, its fencing token
    Inspect {
        name: String,
        #[arg(long, value_enum)]
        kind: Option<NameKind>,
        #[arg(long)]
        json: bool,
    },
    /// The first page of locks, again every interval
    Watch {
        pattern: Option<String>,
        #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = positive_duration)]
        interval: Duration,
        /// Refreshes before it stops [default: until interrupted]
        #[arg(long, value_parser = at_least_one_u64)]
        count: Option<u64>,
        #[arg(long, default_value_t = 100, value_parser = at_least_one)]
        limit: usize,
        #[arg(long)]
        json: bool,
    },
    /// Removes a lock whatever holds it, after asking
    ForceUnlock {
        name: String,
        #[arg(long, value_enum)]
        kind: Option<NameKind>,
        /// Without asking
        #[arg(long, short)]
        yes: bool,
        #[arg(long)]
        json: bool,
    },
    /// Takes a lock and holds it, printing one JSON line per event
    Hold(HoldOptions),
    /// Tells a new or restarted Redis that no holder of a lock it lost still runs
    WaiveQuarantine,
    /// What the idempotency layer stored for KEY
    Idempotent {
        key: String,
        /// One part of the layer's scope (a tenant, say) [default: the default scope]
        #[arg(long = "scope", value_name = "PART")]
        scope: Vec<String>,
        /// The layer's key_prefix
        #[arg(long, value_name = "P", default_value = "")]
        layer_prefix: String,
        #[arg(long)]
        json: bool,
    },
    /// The keys a migration aborted on a cluster left on a master that does not own their slot
    Stranded {
        /// Removes them, after asking
        #[arg(long)]
        delete: bool,
        /// Without asking
        #[arg(long, short, requires = "delete")]
        yes: bool,
        #[arg(long)]
        json: bool,
    },
}

/// `hold`'s options.
#[derive(Args)]
struct HoldOptions {
    name: String,
    /// How long to hold it
    #[arg(long = "for", value_name = "DURATION", value_parser = duration)]
    hold_for: Duration,
    /// A fixed lease, never renewed
    #[arg(long, value_name = "DURATION", value_parser = duration, conflicts_with = "watchdog_lease")]
    lease: Option<Duration>,
    /// The watchdog's lease, renewed every third of it [default: 30s]
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    watchdog_lease: Option<Duration>,
    /// How long to wait for it [default: as long as it takes]
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    wait: Option<Duration>,
    #[arg(long, value_enum, default_value = "exclusive")]
    kind: HoldKind,
    /// A semaphore's permits (--kind semaphore)
    #[arg(long, required_if_eq("kind", "semaphore"))]
    permits: Option<u32>,
    /// The permits to take of them [default: 1]
    #[arg(long, requires = "permits")]
    take: Option<u32>,
}

/// `--kind` of `hold`.
#[derive(Clone, Copy, ValueEnum)]
enum HoldKind {
    Exclusive,
    Fair,
    Read,
    Write,
    Semaphore,
    /// A quorum of the servers named by several --url
    Redlock,
}

/// `--kind` of `inspect` and `force-unlock`: a lock of any kind but a semaphore, or a
/// semaphore, whose keys are apart.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum NameKind {
    Exclusive,
    Semaphore,
}

/// The URLs, what they are, the clients' settings and the command `args` ask for, or what
/// is wrong with them: every check is made here, before any connection.
pub(crate) fn parse(args: Vec<String>) -> Result<Parsed, Refused> {
    let cli = Cli::try_parse_from(std::iter::once("lockctl".to_owned()).chain(args)).map_err(
        |error| match error.kind() {
            clap::error::ErrorKind::DisplayHelp => Refused::Help(error.render().to_string()),
            // No command at all among them: the help, as a usage error.
            _ => Refused::Usage(error.render().to_string()),
        },
    )?;
    let usage = |problem: &str| Refused::Usage(usage_error(problem));
    let (urls, topology, mut settings) = servers(cli.servers).map_err(|problem| usage(&problem))?;
    let command = match cli.verb {
        Verb::Hold(hold) => {
            settings.watchdog_lease = hold.watchdog_lease;
            let kind = match hold.kind {
                HoldKind::Semaphore => Kind::Semaphore {
                    permits: hold.permits.unwrap_or(1),
                    take: hold.take.unwrap_or(1),
                },
                _ if hold.permits.is_some() => {
                    return Err(usage("--permits and --take are for hold --kind semaphore"));
                }
                HoldKind::Exclusive => Kind::Exclusive,
                HoldKind::Fair => Kind::Fair,
                HoldKind::Read => Kind::Read,
                HoldKind::Write => Kind::Write,
                HoldKind::Redlock => Kind::RedLock,
            };
            if kind == Kind::RedLock && !matches!(topology, Topology::Servers) {
                return Err(usage(
                    "--kind redlock takes independent servers, not --cluster or --sentinel",
                ));
            }
            Command::Hold {
                name: hold.name,
                hold_for: hold.hold_for,
                lease: hold.lease,
                wait: hold.wait,
                kind,
            }
        }
        Verb::Inspect { name, kind, json } => Command::Inspect {
            name,
            semaphore: kind == Some(NameKind::Semaphore),
            json,
        },
        Verb::List {
            pattern,
            limit,
            cursor,
            json,
        } => Command::List {
            pattern,
            cursor,
            limit,
            json,
        },
        Verb::Watch {
            pattern,
            interval,
            count,
            limit,
            json,
        } => Command::Watch(Watch {
            pattern,
            limit,
            interval,
            count,
            json,
        }),
        Verb::ForceUnlock {
            name,
            kind,
            yes,
            json,
        } => Command::ForceUnlock {
            name,
            semaphore: kind == Some(NameKind::Semaphore),
            yes,
            json,
        },
        Verb::WaiveQuarantine => Command::WaiveQuarantine,
        Verb::Idempotent {
            key,
            scope,
            layer_prefix,
            json,
        } => Command::Idempotent {
            key,
            // A layer's default scope: one for every request.
            scope: if scope.is_empty() {
                vec!["all".to_owned()]
            } else {
                scope
            },
            layer_prefix,
            json,
        },
        Verb::Stranded { delete, yes, json } => Command::Stranded(Stranded { delete, yes, json }),
    };
    Ok((urls, topology, settings, command))
}

/// A usage error of lockctl's own checks, written as clap writes its own: the problem, the
/// usage line and where to learn more.
pub(crate) fn usage_error(problem: &str) -> String {
    Cli::command()
        .error(clap::error::ErrorKind::ValueValidation, problem)
        .render()
        .to_string()
}

/// The URLs, what they name and the clients' settings the global options ask for; the PEM
/// files are read here, so a missing one is a usage error.
fn servers(options: ServerOptions) -> Result<(Vec<String>, Topology, Settings), String> {
    let topology = match (options.cluster, options.sentinel) {
        (true, Some(_)) => return Err("--cluster and --sentinel name one topology each".into()),
        (true, None) => Topology::Cluster,
        (false, Some(master)) => Topology::Sentinel(master),
        (false, None) => Topology::Servers,
    };
    let mut urls = options.urls;
    if urls.is_empty() {
        if !matches!(topology, Topology::Servers) {
            return Err("--cluster and --sentinel need at least one --url".into());
        }
        urls.push(std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into()));
    }
    let tls_client = match (options.tls_cert, options.tls_key) {
        (Some(certificate), Some(key)) => Some((pem_file(&certificate)?, pem_file(&key)?)),
        (None, None) => None,
        _ => return Err("--tls-cert and --tls-key go together".into()),
    };
    let settings = Settings {
        prefix: options.prefix,
        instance_name: options.instance_name,
        watchdog_lease: None,
        tls_ca: options.tls_ca.as_deref().map(pem_file).transpose()?,
        tls_client,
    };
    Ok((urls, topology, settings))
}

/// The contents of a PEM file named on the command line.
fn pem_file(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|err| format!("cannot read {}: {err}", path.display()))
}

/// A count that must be above 0.
fn at_least_one(text: &str) -> Result<usize, String> {
    match text.parse() {
        Ok(0) => Err("must be above 0".into()),
        Ok(number) => Ok(number),
        Err(_) => Err(format!("bad number {text:?}")),
    }
}

/// A count that must be above 0, as a `u64`.
fn at_least_one_u64(text: &str) -> Result<u64, String> {
    at_least_one(text).map(|number| u64::try_from(number).unwrap_or(u64::MAX))
}

/// A duration above 0.
fn positive_duration(text: &str) -> Result<Duration, String> {
    match duration(text)? {
        zero if zero.is_zero() => Err("must be above 0".into()),
        duration => Ok(duration),
    }
}

/// `250ms`, `2s`, `1m`, or a bare number of seconds, as the help says.
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(args: &[&str]) -> Result<Parsed, Refused> {
        parse(args.iter().map(|arg| (*arg).to_owned()).collect())
    }

    fn usage_error(args: &[&str]) -> String {
        match parsed(args) {
            Err(Refused::Usage(problem)) => problem,
            Err(Refused::Help(_)) => panic!("{args:?} asked for help"),
            Ok(_) => panic!("{args:?} was accepted"),
        }
    }

    #[test]
    fn global_options_go_before_or_after_the_command() {
        for args in [
            &["--url", "redis://a", "--prefix", "p:", "list"][..],
            &["list", "--url", "redis://a", "--prefix", "p:"],
        ] {
            let Ok((urls, _, settings, Command::List { limit, .. })) = parsed(args) else {
                panic!("{args:?}");
            };
            assert_eq!(urls, ["redis://a"]);
            assert_eq!(settings.prefix.as_deref(), Some("p:"));
            assert_eq!(limit, 100);
        }
    }

    #[test]
    fn hold_takes_its_kind_and_a_semaphore_its_permits() {
        let Ok((_, _, _, Command::Hold { kind, hold_for, .. })) = parsed(&[
            "hold",
            "n",
            "--for",
            "250ms",
            "--kind",
            "semaphore",
            "--permits",
            "3",
        ]) else {
            panic!("a semaphore hold");
        };
        assert!(
            kind == Kind::Semaphore {
                permits: 3,
                take: 1
            }
        );
        assert_eq!(hold_for, Duration::from_millis(250));
        assert!(
            usage_error(&["hold", "n", "--for", "1s", "--kind", "semaphore"]).contains("--permits")
        );
        assert!(
            usage_error(&["hold", "n", "--for", "1s", "--permits", "2"])
                .contains("--kind semaphore")
        );
        assert!(usage_error(&["hold", "n"]).contains("--for"));
        assert!(
            usage_error(&[
                "hold",
                "n",
                "--for",
                "1s",
                "--lease",
                "1s",
                "--watchdog-lease",
                "3s"
            ])
            .contains("cannot be used with")
        );
        assert!(
            usage_error(&[
                "--cluster",
                "--url",
                "redis://a",
                "hold",
                "n",
                "--for",
                "1s",
                "--kind",
                "redlock"
            ])
            .contains("independent servers")
        );
    }

    #[test]
    fn mistakes_are_usage_errors_and_help_is_help() {
        assert!(usage_error(&[]).contains("Usage:"));
        assert!(usage_error(&["list", "--yes"]).contains("--yes"));
        assert!(usage_error(&["watch", "--interval", "0s"]).contains("above 0"));
        assert!(usage_error(&["list", "--limit", "0"]).contains("above 0"));
        assert!(usage_error(&["stranded", "--yes"]).contains("--delete"));
        assert!(usage_error(&["--cluster", "list"]).contains("at least one --url"));
        assert!(usage_error(&["inspect", "n", "--kind", "fair"]).contains("semaphore"));
        assert!(
            matches!(parsed(&["--help"]), Err(Refused::Help(help)) if help.contains("force-unlock"))
        );
        assert!(
            matches!(parsed(&["hold", "--help"]), Err(Refused::Help(help)) if help.contains("--permits"))
        );
    }

    #[test]
    fn durations_read_as_the_help_says() {
        assert_eq!(duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(duration("1m"), Ok(Duration::from_secs(60)));
        assert!(duration("1h").is_err());
        assert!(duration("soon").is_err());
    }
}
