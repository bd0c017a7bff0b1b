//! The operator's commands: `list`, `inspect`, `watch` and `force-unlock` (and the question
//! `force-unlock` and `stranded --delete` ask).

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use serde_json::json;
use tower_redis_lock::inspect::LockSnapshot;
use tower_redis_lock::{ErrorKind, LockClient, LockError, LockKind};

use crate::out::emit;
use crate::out::{self, say, sayln};
use crate::show::{self, human};

/// Clears a terminal and puts the cursor at its top left (ANSI).
const CLEAR: &str = "\x1b[H\x1b[2J";

/// `lockctl list`: one page of locks and semaphores, as a table or as JSON lines (each
/// `"event": "lock"`, a semaphore's with its `permits`) and a last `page` line.
pub(crate) async fn list(
    locks: &LockClient,
    pattern: Option<&str>,
    cursor: Option<&str>,
    limit: usize,
    json: bool,
) -> Result<ExitCode, LockError> {
    let page = locks.list(pattern, cursor, limit).await?;
    if json {
        for lock in &page.locks {
            emit(show::json_of(lock, "lock"));
        }
        emit(json!({
            "event": "page",
            "locks": page.locks.len(),
            "scans": page.scans,
            "next_cursor": page.next_cursor,
        }));
        return Ok(ExitCode::SUCCESS);
    }
    if page.locks.is_empty() {
        sayln!("no locks{}", matching(pattern));
    } else {
        say!("{}", show::table(&page.locks));
    }
    if let Some(next) = &page.next_cursor {
        sayln!("more locks may follow: add --cursor {next}");
    }
    Ok(ExitCode::SUCCESS)
}

fn matching(pattern: Option<&str>) -> String {
    pattern.map_or_else(String::new, |pattern| format!(" matching {pattern:?}"))
}

/// `lockctl inspect NAME`: the lock (or with `--kind semaphore` the semaphore) in full, or
/// its JSON (`"event": "inspect"`).
pub(crate) async fn inspect(
    locks: &LockClient,
    name: &str,
    semaphore: bool,
    json: bool,
) -> Result<ExitCode, LockError> {
    let lock = read(locks, name, semaphore).await?;
    if json {
        emit(show::json_of(&lock, "inspect"));
    } else {
        say!("{}", show::details(&lock));
    }
    Ok(ExitCode::SUCCESS)
}

/// What `lockctl watch` does.
#[derive(Debug)]
pub(crate) struct Watch {
    pub(crate) pattern: Option<String>,
    pub(crate) limit: usize,
    pub(crate) interval: Duration,
    /// Refreshes before it stops (`None`: until interrupted).
    pub(crate) count: Option<u64>,
    pub(crate) json: bool,
}

/// `lockctl watch`: the first page of locks every interval. On a terminal the table is
/// redrawn in place; otherwise each refresh prints a `refresh=N time=… locks=…` line and one
/// line per lock (JSON objects with `--json`). A refresh that cannot reach Redis says so and
/// the watch goes on.
pub(crate) async fn watch(locks: &LockClient, watch: Watch) -> Result<ExitCode, LockError> {
    let terminal = std::io::stdout().is_terminal() && !watch.json;
    let mut ticks = tokio::time::interval(watch.interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut refresh = 0;
    while watch.count.is_none_or(|count| refresh < count) && !out::reader_gone() {
        ticks.tick().await;
        refresh += 1;
        let time = show::now_utc();
        let page = match locks
            .list(watch.pattern.as_deref(), None, watch.limit)
            .await
        {
            Ok(page) => page,
            Err(err) if passing(&err) => {
                if watch.json {
                    emit(
                        json!({"event": "error", "refresh": refresh, "time": time, "kind": format!("{:?}", err.kind()), "message": err.to_string()}),
                    );
                } else if terminal {
                    say!("{CLEAR}{}\n\n{err}\n", title(&watch, &time));
                } else {
                    sayln!("refresh={refresh} time={time} error={:?}", err.to_string());
                }
                continue;
            }
            Err(err) => return Err(err),
        };
        let more = page.next_cursor.is_some();
        if watch.json {
            emit(
                json!({"event": "refresh", "refresh": refresh, "time": time, "locks": page.locks.len(), "more": more}),
            );
            for lock in &page.locks {
                let mut line = show::json_of(lock, "lock");
                line["refresh"] = json!(refresh);
                emit(line);
            }
        } else if terminal {
            let body = if page.locks.is_empty() {
                format!("no locks{}\n", matching(watch.pattern.as_deref()))
            } else {
                show::table(&page.locks)
            };
            let footer = if more {
                format!(
                    "(the first {} locks found; lockctl list pages on)\n",
                    page.locks.len()
                )
            } else {
                String::new()
            };
            say!("{CLEAR}{}\n\n{body}{footer}", title(&watch, &time));
        } else {
            sayln!(
                "refresh={refresh} time={time} locks={} more={more}",
                page.locks.len()
            );
            for lock in &page.locks {
                sayln!("refresh={refresh} time={time} {}", show::line(lock));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether a failed refresh is worth reporting and going on from: Redis away or failing.
fn passing(err: &LockError) -> bool {
    matches!(err.kind(), ErrorKind::RedisUnavailable | ErrorKind::Redis)
}

fn title(watch: &Watch, time: &str) -> String {
    format!(
        "lockctl watch{}, every {}: {time} (Ctrl-C stops)",
        matching(watch.pattern.as_deref()),
        human(watch.interval)
    )
}

/// Whether `force-unlock` (or `stranded --delete`) may ask on this terminal; without one it
/// needs `--yes`.
pub(crate) fn can_confirm() -> bool {
    std::io::stdin().is_terminal()
}

/// Asks `question` on the terminal (stderr, so stdout stays the command's): whether the
/// operator answered yes. Anything else, an empty line or end of input included, is no.
pub(crate) fn confirmed(question: &str) -> bool {
    eprint!("{question} [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    let _ = std::io::stdin().lock().read_line(&mut answer);
    matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes")
}

/// The lock `name`, or the semaphore `name`, as Redis holds it.
async fn read(locks: &LockClient, name: &str, semaphore: bool) -> Result<LockSnapshot, LockError> {
    if semaphore {
        locks.inspect_semaphore(name).await
    } else {
        locks.inspect(name).await
    }
}

/// `lockctl force-unlock NAME`: shows who holds the lock, asks (unless `yes`), removes it
/// and hands it to the first live waiter. A read-write lock is removed as one, so that its
/// queue is served as a read-write lock's (one writer, or the readers first in line). With
/// `--kind semaphore`, every holder of the semaphore is removed, and its queue gets the
/// permits in order.
pub(crate) async fn force_unlock(
    locks: &LockClient,
    name: &str,
    semaphore: bool,
    yes: bool,
    json: bool,
) -> Result<ExitCode, LockError> {
    let before = read(locks, name, semaphore).await?;
    if before.holders.is_empty() {
        return Ok(unlocked(name, false, json));
    }
    if !yes {
        eprintln!("{}", summary(&before));
        if !confirmed(&format!("force-unlock {name}?")) {
            eprintln!("not unlocked");
            return Ok(ExitCode::from(1));
        }
    }
    let removed = if semaphore {
        // The count is only for acquisitions: removing needs none, and changes none.
        let any_count = before.permits.map_or(1, |permits| permits.total.max(1));
        locks.semaphore(name, any_count)?.force_unlock().await?
    } else if show::kind_of(&before).0 == "read-write" {
        locks.read_write_lock(name)?.write().force_unlock().await?
    } else {
        locks.lock(name)?.force_unlock().await?
    };
    if removed && !json {
        let after = read(locks, name, semaphore).await?;
        let next = match after.holders.as_slice() {
            [] => String::new(),
            holders => {
                let instances: Vec<&str> = holders.iter().map(|h| h.instance.as_str()).collect();
                format!("; it went to the next in line: {}", instances.join(", "))
            }
        };
        sayln!("force-unlocked {name}{next}");
        return Ok(ExitCode::SUCCESS);
    }
    Ok(unlocked(name, removed, json))
}

/// Says whether `force-unlock` removed the lock (or semaphore) `name`.
fn unlocked(name: &str, removed: bool, json: bool) -> ExitCode {
    if json {
        emit(json!({"event": "force-unlocked", "name": name, "removed": removed}));
    } else if removed {
        sayln!("force-unlocked {name}");
    } else {
        sayln!("{name} is not held: nothing removed");
    }
    ExitCode::SUCCESS
}

/// Who holds a lock and who waits, in one sentence, before the question.
fn summary(lock: &LockSnapshot) -> String {
    let waiting = match lock.queued {
        0 => String::new(),
        1 => "; 1 waits".to_owned(),
        queued => format!("; {queued} wait"),
    };
    let holders: Vec<String> = lock
        .holders
        .iter()
        .map(|holder| {
            let kind = match lock.held_as {
                Some(LockKind::Read) => " reading",
                Some(LockKind::Write) => " writing",
                _ => "",
            };
            let holds = match holder.permits {
                Some(permits) => plural(u64::from(permits), "permit"),
                None => plural(holder.holds, "hold"),
            };
            format!(
                "{}{kind} (owner {}, {holds}, lease {} left)",
                holder.instance,
                holder.owner,
                holder.lease_left.map_or_else(|| "-".to_owned(), human),
            )
        })
        .collect();
    let what = if lock.is_semaphore() {
        "semaphore "
    } else {
        ""
    };
    format!(
        "{what}{} is held by {}{waiting}",
        lock.name,
        holders.join(", ")
    )
}

/// `1 permit`, `2 permits`.
fn plural(count: u64, noun: &str) -> String {
    match count {
        1 => format!("1 {noun}"),
        count => format!("{count} {noun}s"),
    }
}
