//! How `lockctl` shows locks: tables for people, one `key=value` line per lock for logs and
//! pipes, and JSON objects for scripts.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tower_redis_lock::LockKind;
use tower_redis_lock::inspect::{Liveness, LockHolder, LockSnapshot, LockWaiter};

/// The longest lock name a table shows whole (longer ones are cut, as the library's logs cut
/// them).
const SHOWN_NAME: usize = 64;

/// Holders a table row names before it only counts the rest.
const SHOWN_HOLDERS: usize = 3;

/// What a lock is, as a word: `exclusive` (an exclusive or a fair lock: Redis does not tell
/// them apart), `read-write` (with how it is held: `read` or `write`), `semaphore`, or
/// `free`.
pub(crate) fn kind_of(lock: &LockSnapshot) -> (&'static str, Option<&'static str>) {
    let read_write = |kind: LockKind| matches!(kind, LockKind::Read | LockKind::Write);
    if lock.is_semaphore() {
        return ("semaphore", None);
    }
    match lock.held_as {
        Some(LockKind::Read) => ("read-write", Some("read")),
        Some(LockKind::Write) => ("read-write", Some("write")),
        Some(_) => ("exclusive", None),
        None if lock.waiters.iter().any(|waiter| read_write(waiter.wants)) => ("read-write", None),
        None if lock.queued > 0 => ("exclusive", None),
        None => ("free", None),
    }
}

/// `kind_of` in one word: `read-write:read`.
fn kind_word(lock: &LockSnapshot) -> String {
    match kind_of(lock) {
        (kind, Some(mode)) => format!("{kind}:{mode}"),
        (kind, None) => kind.to_owned(),
    }
}

fn wants(kind: LockKind) -> &'static str {
    match kind {
        LockKind::Read => "read",
        LockKind::Write => "write",
        LockKind::Semaphore { .. } => "semaphore",
        _ => "exclusive",
    }
}

/// The permits a semaphore's waiter asks for; `None` for a lock's.
fn wanted_permits(kind: LockKind) -> Option<u32> {
    match kind {
        LockKind::Semaphore { take, .. } => Some(take),
        _ => None,
    }
}

/// What a waiter wants, for people: `write`, `2 permits`.
fn wants_cell(kind: LockKind) -> String {
    match wanted_permits(kind) {
        Some(1) => "1 permit".to_owned(),
        Some(take) => format!("{take} permits"),
        None => wants(kind).to_owned(),
    }
}

/// A semaphore's permits as `free/total` (`1/3`: one of three free); `-` for a lock.
fn free_cell(lock: &LockSnapshot) -> String {
    or_dash(
        lock.permits
            .map(|permits| format!("{}/{}", permits.free, permits.total)),
    )
}

/// A lock as JSON: the fields `lockctl inspect` has always printed (`name`, `key`, `locked`,
/// `holders` with `owner` and `count`, `hold_count`, `pttl_ms`, `fence`) and the rest of
/// what Redis holds. A semaphore's (`"kind": "semaphore"`) has its `permits` (`total`,
/// `used`, `free`), each holder's `permits` and each waiter's (`null` for a lock's).
pub(crate) fn json_of(lock: &LockSnapshot, event: &str) -> Value {
    let (kind, mode) = kind_of(lock);
    let holders: Vec<Value> = lock
        .holders
        .iter()
        .map(|holder| {
            json!({
                "owner": holder.owner,
                "instance": holder.instance,
                "count": holder.holds,
                "lease_left_ms": holder.lease_left.map(millis),
                "permits": holder.permits,
            })
        })
        .collect();
    let waiters: Vec<Value> = lock
        .waiters
        .iter()
        .enumerate()
        .map(|(index, waiter)| waiter_json(index + 1, waiter))
        .collect();
    json!({
        "event": event,
        "name": lock.name,
        "key": lock.key,
        "kind": kind,
        "mode": mode,
        "locked": !lock.holders.is_empty(),
        "holders": holders,
        "hold_count": lock.holders.iter().map(|holder| holder.holds).sum::<u64>(),
        "pttl_ms": lock.lease_left.map(millis),
        "fence": lock.fence,
        "queued": lock.queued,
        "waiters": waiters,
        "server_time_ms": lock.server_time_ms,
        "permits": lock.permits.map(|permits| json!({
            "total": permits.total,
            "used": permits.used,
            "free": permits.free,
        })),
        "leader": lock.leader.as_ref().map(|leader| json!({
            "owner": leader.owner,
            "instance": leader.instance,
            "term": leader.term,
            "since_ms": leader.since_ms,
            "leading": leader.leading,
        })),
    })
}

/// A singleton's leader, for people: `orders-a, term 1795…, for 12.3s`, or `none (the last:
/// orders-a, term …, from …)` when nobody leads now.
fn leader_fact(lock: &LockSnapshot) -> String {
    let Some(leader) = &lock.leader else {
        return "-".to_owned();
    };
    let since = Duration::from_millis(lock.server_time_ms.saturating_sub(leader.since_ms));
    if leader.leading {
        format!(
            "{}, term {}, for {}",
            leader.instance,
            leader.term,
            human(since)
        )
    } else {
        format!(
            "none (the last: {}, term {}, from {} ago)",
            leader.instance,
            leader.term,
            human(since)
        )
    }
}

fn waiter_json(position: usize, waiter: &LockWaiter) -> Value {
    let (alive_left, dead_for) = match waiter.liveness {
        Liveness::Alive(left) => (Some(millis(left)), None),
        Liveness::Dead(ago) => (None, Some(millis(ago))),
        _ => (None, None),
    };
    json!({
        "position": position,
        "owner": waiter.owner,
        "instance": waiter.instance,
        "wants": wants(waiter.wants),
        "permits": wanted_permits(waiter.wants),
        "waited_ms": millis(waiter.waited),
        "alive": waiter.is_alive(),
        "alive_left_ms": alive_left,
        "dead_for_ms": dead_for,
    })
}

/// The locks as a table: NAME KIND HOLDERS LEASE TOKEN WAITERS, and FREE (a
/// semaphore's free permits of its count) when the table has a semaphore.
pub(crate) fn table(locks: &[LockSnapshot]) -> String {
    let semaphores = locks.iter().any(LockSnapshot::is_semaphore);
    let rows = locks
        .iter()
        .map(|lock| {
            let mut row = vec![
                cut(&lock.name),
                kind_word(lock),
                holders_cell(&lock.holders),
                or_dash(lock.lease_left.map(human)),
                or_dash(lock.fence.map(|fence| fence.to_string())),
                waiters_cell(lock),
            ];
            if semaphores {
                row.push(free_cell(lock));
            }
            row
        })
        .collect();
    let mut headers = vec!["NAME", "KIND", "HOLDERS", "LEASE", "TOKEN", "WAITERS"];
    if semaphores {
        headers.push("FREE");
    }
    columns(&headers, rows)
}

/// One lock in full, for `lockctl inspect`: its state, its holders and its queue in order.
pub(crate) fn details(lock: &LockSnapshot) -> String {
    let mut out = String::new();
    let (kind, mode) = kind_of(lock);
    let kind = match mode {
        Some(mode) => format!("{kind}, {mode}-held"),
        None => kind.to_owned(),
    };
    let facts = [
        ("NAME", lock.name.clone()),
        ("KEY", lock.key.clone()),
        ("KIND", kind),
        ("PERMITS", permits_fact(lock)),
        (
            "LEASE",
            or_dash(lock.lease_left.map(|left| format!("{} left", human(left)))),
        ),
        ("TOKEN", or_dash(lock.fence.map(|fence| fence.to_string()))),
        ("LEADER", leader_fact(lock)),
        ("HOLDERS", lock.holders.len().to_string()),
    ];
    for (label, value) in facts {
        // Only a semaphore has permits; only a singleton's lock a leader.
        if (label == "PERMITS" && !lock.is_semaphore())
            || (label == "LEADER" && lock.leader.is_none())
        {
            continue;
        }
        let _ = writeln!(out, "{label:<9}{value}");
    }
    if !lock.holders.is_empty() {
        let rows = lock
            .holders
            .iter()
            .map(|holder| {
                vec![
                    holder.instance.clone(),
                    holder.permits.map_or(holder.holds, u64::from).to_string(),
                    or_dash(holder.lease_left.map(human)),
                    holder.owner.clone(),
                ]
            })
            .collect();
        // A semaphore's holder holds once, some of its permits.
        let counted = if lock.is_semaphore() {
            "PERMITS"
        } else {
            "HOLDS"
        };
        indent(
            &mut out,
            &columns(&["INSTANCE", counted, "LEASE", "OWNER"], rows),
        );
    }
    let _ = writeln!(out, "{:<9}{}", "WAITERS", waiters_cell(lock));
    if !lock.waiters.is_empty() {
        let rows = lock
            .waiters
            .iter()
            .enumerate()
            .map(|(index, waiter)| {
                vec![
                    (index + 1).to_string(),
                    waiter.instance.clone(),
                    wants_cell(waiter.wants),
                    human(waiter.waited),
                    liveness(waiter.liveness),
                    waiter.owner.clone(),
                ]
            })
            .collect();
        let headers = ["#", "INSTANCE", "WANTS", "WAITED", "LIVENESS", "OWNER"];
        indent(&mut out, &columns(&headers, rows));
        let display_name = lock.waiters.len() as u64;
        if lock.queued > display_name {
            let _ = writeln!(out, "  … and {} more", lock.queued - display_name);
        }
    }
    out
}

/// A semaphore's permits for `inspect`: `3 (2 held, 1 free)`; `-` once nobody holds it
/// (Redis keeps the count only while someone does).
fn permits_fact(lock: &LockSnapshot) -> String {
    match lock.permits {
        Some(permits) if permits.total > 0 => format!(
            "{} ({} held, {} free)",
            permits.total, permits.used, permits.free
        ),
        _ => "-".to_owned(),
    }
}

/// One lock as one `key=value` line (no spaces inside values), for logs and pipes; a
/// semaphore's ends with its `permits=` count, and how many are `used=` and `free=`.
pub(crate) fn line(lock: &LockSnapshot) -> String {
    let holders: Vec<String> = lock.holders.iter().map(holder_word).collect();
    let dead = lock
        .waiters
        .iter()
        .filter(|waiter| !waiter.is_alive())
        .count();
    let permits = lock.permits.map_or_else(String::new, |permits| {
        format!(
            " permits={} used={} free={}",
            permits.total, permits.used, permits.free
        )
    });
    format!(
        "name={} kind={} holders={} lease={} token={} waiters={} dead={}{permits}",
        lock.name.replace(char::is_whitespace, "_"),
        kind_word(lock),
        or_dash((!holders.is_empty()).then(|| holders.join(","))),
        or_dash(lock.lease_left.map(human)),
        or_dash(lock.fence.map(|fence| fence.to_string())),
        lock.queued,
        dead,
    )
}

/// A holder as `instance(holds)`; a semaphore's as `instance(permits it holds)`.
fn holder_word(holder: &LockHolder) -> String {
    let count = holder.permits.map_or(holder.holds, u64::from);
    format!("{}({count})", holder.instance)
}

fn holders_cell(holders: &[LockHolder]) -> String {
    if holders.is_empty() {
        return "-".to_owned();
    }
    let mut display_name: Vec<String> = holders
        .iter()
        .take(SHOWN_HOLDERS)
        .map(holder_word)
        .collect();
    if holders.len() > SHOWN_HOLDERS {
        display_name.push(format!("+{}", holders.len() - SHOWN_HOLDERS));
    }
    display_name.join(",")
}

/// How many wait, and how many of those shown are dead.
fn waiters_cell(lock: &LockSnapshot) -> String {
    let dead = lock
        .waiters
        .iter()
        .filter(|waiter| !waiter.is_alive())
        .count();
    match dead {
        0 => lock.queued.to_string(),
        dead => format!("{} ({dead} dead)", lock.queued),
    }
}

fn liveness(liveness: Liveness) -> String {
    match liveness {
        Liveness::Alive(left) => format!("alive, {} left", human(left)),
        Liveness::Dead(ago) => format!("dead {} ago", human(ago)),
        _ => "unknown".to_owned(),
    }
}

/// Left-aligned columns two spaces apart.
fn columns(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = headers
        .iter()
        .map(|header| header.chars().count())
        .collect();
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let headers = headers.iter().map(|header| (*header).to_owned()).collect();
    for row in std::iter::once(headers).chain(rows) {
        let mut text = String::new();
        for (cell, width) in row.iter().zip(&widths) {
            let _ = write!(text, "{cell:<width$}  ");
        }
        out.push_str(text.trim_end());
        out.push('\n');
    }
    out
}

fn indent(out: &mut String, text: &str) {
    for line in text.lines() {
        let _ = writeln!(out, "  {line}");
    }
}

/// A name cut to 64 bytes, on a character boundary.
fn cut(name: &str) -> String {
    if name.len() <= SHOWN_NAME {
        return name.to_owned();
    }
    let mut end = SHOWN_NAME;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &name[..end])
}

fn or_dash(value: Option<String>) -> String {
    value.unwrap_or_else(|| "-".to_owned())
}

/// A duration for people: `850ms`, `29.4s`, `12m05s`, `3h02m`.
pub(crate) fn human(duration: Duration) -> String {
    let ms = duration.as_millis();
    let secs = duration.as_secs();
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{}.{}s", secs, (ms % 1_000) / 100),
        60_000..3_600_000 => format!("{}m{:02}s", secs / 60, secs % 60),
        _ => format!("{}h{:02}m", secs / 3_600, (secs % 3_600) / 60),
    }
}

pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The time now in UTC, as RFC 3339 with milliseconds: `2025-06-01T12:03:04.123Z`.
pub(crate) fn now_utc() -> String {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = since.as_secs();
    let (days, day_secs) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's days-to-civil, from 1970-01-01.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        day_secs / 3_600,
        (day_secs % 3_600) / 60,
        day_secs % 60,
        since.subsec_millis()
    )
}
