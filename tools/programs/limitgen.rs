//! Load generator and checker for the demo's per-tenant limit (`./scripts/demo.sh --limit 3`).
//!
//! Sends concurrent `POST /tenants/{tenant}/orders` to several instances of the
//! `axum_tenants` example started with `--limit N` (many tenants, a few hot ones), then
//! counts, per tenant, the most handlers that ran at once across every instance, from the
//! start and end each handler reported (on the wall clock every process on the machine
//! shares; each reported span lies inside the handler's permit, so the count never
//! overstates). Checks that no tenant went over `N`, that `N` was reached (the limit let that
//! many in, rather than serializing), and that no two handlers of a tenant shared a fencing
//! token. Prints a short report and, last, one JSON line. Exits 1 if a check failed or a
//! request did.
//!
//! ```text
//! limitgen --limit 3 --targets http://127.0.0.1:3000,http://127.0.0.1:3001 \
//!          [--requests 3000] [--tenants 40] [--hot 3] [--concurrency 48]
//! ```

#[path = "orders_traffic.rs"]
mod orders_traffic;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use serde::Deserialize;
use serde_json::json;

use orders_traffic::{percentile, plan, send};

/// One handler run, as the instance reported it.
#[derive(Debug, Deserialize)]
struct Served {
    tenant: String,
    token: u64,
    waited_us: u64,
    started_us: u64,
    ended_us: u64,
}

struct Settings {
    limit: usize,
    targets: Vec<String>,
    requests: usize,
    tenants: usize,
    hot: usize,
    concurrency: usize,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let settings = parse()?;
    let started = Instant::now();
    let plan = plan(settings.requests, settings.tenants, settings.hot);
    let answers = send::<Served>(&settings.targets, settings.concurrency, Arc::new(plan)).await;
    let (served, failures) = (answers.reports, answers.failures);
    let elapsed = started.elapsed();

    let most = most_at_once(&served);
    let shared_tokens = shared_tokens(&served);
    let limit = settings.limit;
    let over: Vec<&String> = most
        .iter()
        .filter(|(_, n)| **n > limit)
        .map(|(t, _)| t)
        .collect();
    let reached = most.values().filter(|n| **n == limit).count();
    let hot: Vec<String> = (0..settings.hot)
        .map(|tenant| {
            let name = format!("t{tenant}");
            format!("{name} {}", most.get(&name).copied().unwrap_or(0))
        })
        .collect();
    let others = most
        .iter()
        .filter(|(tenant, _)| !is_hot(tenant, settings.hot))
        .map(|(_, n)| *n)
        .max()
        .unwrap_or(0);

    println!("per-tenant limit demo (limit {limit} per tenant, across instances)");
    println!("  instances              {}", settings.targets.len());
    println!(
        "  requests               {} ({failures} failed) in {:.2} s",
        served.len() + failures,
        elapsed.as_secs_f64()
    );
    println!(
        "  tenants                {} ({} hot, half the traffic)",
        settings.tenants, settings.hot
    );
    println!("  most at once, hot      {}", hot.join(", "));
    println!("  most at once, others   {others}");
    println!(
        "  reached the limit      {reached} of {} tenants",
        most.len()
    );
    println!("  over the limit         {} tenants", over.len());
    println!("  shared fencing tokens  {shared_tokens}");
    let mut waits: Vec<u64> = served.iter().map(|run| run.waited_us).collect();
    waits.sort_unstable();
    let ms = |us: u64| (us as f64 / 100.0).round() / 10.0;
    let (wait_p50, wait_p99) = (ms(percentile(&waits, 50)), ms(percentile(&waits, 99)));
    println!("  permit wait p50 / p99  {wait_p50} / {wait_p99} ms");
    println!(
        "{}",
        json!({
            "limit": limit,
            "instances": settings.targets.len(),
            "requests": served.len() + failures,
            "failed": failures,
            "most_at_once": most.values().max().copied().unwrap_or(0),
            "most_at_once_per_tenant": most,
            "tenants_reaching_limit": reached,
            "tenants_over_limit": over.len(),
            "shared_tokens": shared_tokens,
            "wait_p50_ms": wait_p50,
            "wait_p99_ms": wait_p99,
        })
    );
    if !over.is_empty() || reached == 0 || shared_tokens > 0 || failures > 0 {
        std::process::exit(1);
    }
    Ok(())
}

fn is_hot(tenant: &str, hot: usize) -> bool {
    tenant
        .strip_prefix('t')
        .and_then(|n| n.parse::<usize>().ok())
        .is_some_and(|n| n < hot)
}

/// Per tenant, the most handlers that ran at once: a sweep over starts and ends, an end
/// before a start at the same microsecond (a handler that ended as the next began did not
/// overlap it).
fn most_at_once(served: &[Served]) -> BTreeMap<String, usize> {
    let mut events: BTreeMap<&str, Vec<(u64, i8)>> = BTreeMap::new();
    for run in served {
        let tenant = events.entry(&run.tenant).or_default();
        tenant.push((run.started_us, 1));
        tenant.push((run.ended_us, -1));
    }
    events
        .into_iter()
        .map(|(tenant, mut events)| {
            events.sort_unstable();
            let (mut now, mut most) = (0_i64, 0_i64);
            for (_, step) in events {
                now += i64::from(step);
                most = most.max(now);
            }
            (tenant.to_owned(), most as usize)
        })
        .collect()
}

/// Handler runs of a tenant whose fencing token another run of the tenant also had.
/// Names the first few on stderr.
fn shared_tokens(served: &[Served]) -> usize {
    let mut seen = BTreeSet::new();
    let shared: Vec<&Served> = served
        .iter()
        .filter(|run| !seen.insert((&run.tenant, run.token)))
        .collect();
    for run in shared.iter().take(5) {
        eprintln!(
            "tenant {} had fencing token {} twice (one run from {} to {} us)",
            run.tenant, run.token, run.started_us, run.ended_us
        );
    }
    shared.len()
}

fn parse() -> Result<Settings, String> {
    let mut settings = Settings {
        limit: 0,
        targets: Vec::new(),
        requests: 3000,
        tenants: 40,
        hot: 3,
        concurrency: 48,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let number = || {
            value
                .parse::<usize>()
                .map_err(|_| format!("{flag}: not a number"))
        };
        match flag.as_str() {
            "--limit" => settings.limit = number()?,
            "--targets" => settings.targets = value.split(',').map(str::to_owned).collect(),
            "--requests" => settings.requests = number()?,
            "--tenants" => settings.tenants = number()?,
            "--hot" => settings.hot = number()?,
            "--concurrency" => settings.concurrency = number()?,
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    if settings.targets.is_empty() || settings.limit == 0 {
        return Err("need --targets and --limit (at least 1)".into());
    }
    if settings.hot == 0 || settings.hot >= settings.tenants {
        return Err("need 0 < --hot < --tenants".into());
    }
    Ok(settings)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(tenant: &str, token: u64, started_us: u64, ended_us: u64) -> Served {
        Served {
            tenant: tenant.into(),
            token,
            waited_us: 0,
            started_us,
            ended_us,
        }
    }

    #[test]
    fn the_sweep_counts_overlaps_per_tenant_and_not_touching_runs() {
        let served = [
            run("a", 1, 0, 10),
            run("a", 2, 5, 20),
            run("a", 3, 8, 9),
            // Starts as the first ends: not an overlap with it.
            run("a", 4, 10, 12),
            run("b", 1, 0, 100),
        ];
        let most = most_at_once(&served);
        assert_eq!(most["a"], 3);
        assert_eq!(most["b"], 1);
        assert_eq!(shared_tokens(&served), 0);
        assert_eq!(shared_tokens(&[run("a", 1, 0, 1), run("a", 1, 2, 3)]), 1);
    }
}
