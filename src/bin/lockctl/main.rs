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
//! lockctl [--url URL] idempotent KEY [--scope PART ...] [--layer-prefix P] [--json]
//! lockctl --cluster --url SEED stranded [--delete [--yes]] [--json]
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
//! unless `--lease` fixes it. `idempotent` shows what the idempotency layer stored for KEY:
//! each `--scope` is one part of the layer's scope (a tenant, say; none: the default scope),
//! `--layer-prefix` the layer's `key_prefix`. `stranded` lists the keys under the prefix that
//! sit on a cluster master that does not own their slot while the slot is stable (what a
//! migration aborted after some keys moved leaves behind), and with `--delete` removes them,
//! after asking as `force-unlock` does; without a cluster there is nothing to check.
//! With `--cluster`, the URLs are seeds of one Redis Cluster (without it too, when the first
//! URL's server is a node of a cluster: a note on stderr says so); with `--sentinel MASTER`,
//! they are the sentinels that name that master; `--prefix` is the clients' key prefix and
//! `--instance-name` names lockctl's own instance (what others see holding or waiting).
//! A `rediss://` URL is checked against the system's roots unless `--tls-ca FILE` names the
//! CA (PEM) to trust; `--tls-cert FILE --tls-key FILE` present a client certificate to a
//! server that asks for one. A password goes in the URL (`rediss://user:password@host`).
//! Exit codes: 0 done, 1 error (or a force-unlock or a stranded --delete answered no, or a
//! master stranded could not check), 2 usage (or either without a terminal to ask on and
//! without `--yes`), 3 wait timed out, 4 lease lost while holding. The URL defaults to
//! `$REDIS_URL`, else `redis://127.0.0.1:6379`.

mod args;
mod connect;
mod dispatch;
mod hold;
mod idempotent;
mod nodes;
mod operate;
mod out;
mod servers;
mod show;
mod stranded;

use std::process::ExitCode;

use serde_json::json;

use crate::args::{Command, Refused, parse, usage_error};
use crate::connect::{run, settle};
use crate::out::{emit, say};
use crate::stranded::Stranded;

/// Parses, refuses a force-unlock or a deletion of stranded keys it cannot confirm, runs the
/// command and turns the outcome into the exit code; an error is a JSON event where the
/// command prints JSON.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let (urls, topology, settings, command) = match parse(std::env::args().skip(1).collect()) {
        Ok(parsed) => parsed,
        Err(Refused::Help(help)) => {
            say!("{help}");
            return ExitCode::SUCCESS;
        }
        Err(Refused::Usage(problem)) => {
            eprint!("{problem}");
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
    if let Command::Stranded(Stranded {
        delete: true,
        yes: false,
        ..
    }) = &command
        && !operate::can_confirm()
    {
        eprintln!(
            "lockctl: stranded --delete asks for confirmation, and stdin is not a terminal: \
             pass --yes to delete without asking; nothing was changed"
        );
        return ExitCode::from(2);
    }
    let topology = match settle(&urls, topology, &settings, &command).await {
        Ok(topology) => topology,
        Err(problem) => {
            eprint!("{}", usage_error(&problem));
            return ExitCode::from(2);
        }
    };
    let json_errors = match &command {
        Command::Hold { .. } | Command::WaiveQuarantine => true,
        Command::Inspect { json, .. }
        | Command::List { json, .. }
        | Command::ForceUnlock { json, .. }
        | Command::Idempotent { json, .. } => *json,
        Command::Watch(watch) => watch.json,
        Command::Stranded(ask) => ask.json,
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
