//! Load generator and checker for the multi-instance demo.
//!
//! Sends concurrent `POST /tenants/{tenant}/orders` to several instances of the
//! `axum_tenants` example (many tenants, a few hot ones), then checks per tenant that no two
//! handlers overlapped, that fencing tokens grew in the order the handlers ran, and that no
//! update was lost. Prints a short report and, last, one JSON line. Exits 1 on any overlap,
//! lost update or failed request.
//!
//! ```text
//! loadgen --redis URL --targets http://127.0.0.1:3000,http://127.0.0.1:3001 \
//!         [--requests 3000] [--tenants 40] [--hot 3] [--concurrency 48]
//! ```
//!
//! On a Redis Cluster, pass `--cluster` and one `--redis` per master: the command counts are
//! summed over them.

#[path = "orders_traffic.rs"]
mod orders_traffic;
#[path = "sent_commands.rs"]
mod sent_commands;

use std::collections::BTreeMap;
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
    count: u64,
    waited_us: u64,
    started_us: u64,
    ended_us: u64,
}

struct Settings {
    /// The server, or every master of the cluster.
    redis: Vec<String>,
    cluster: bool,
    targets: Vec<String>,
    requests: usize,
    tenants: usize,
    hot: usize,
    concurrency: usize,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let settings = parse()?;
    let mut nodes = Vec::new();
    for url in &settings.redis {
        let mut node = redis::Client::open(url.as_str())?
            .get_multiplexed_async_connection()
            .await?;
        sent_commands::start(&mut node).await?;
        nodes.push(node);
    }

    let plan = plan(settings.requests, settings.tenants, settings.hot);
    let started = Instant::now();
    let answers = send::<Served>(&settings.targets, settings.concurrency, Arc::new(plan)).await;
    let (served, latencies, failures) = (answers.reports, answers.latencies_us, answers.failures);
    let elapsed = started.elapsed();

    let mut sent: BTreeMap<String, u64> = BTreeMap::new();
    for node in &mut nodes {
        for (name, calls) in sent_commands::sent(node).await? {
            *sent.entry(name).or_default() += calls;
        }
    }
    // Each handler run sends one GET and one SET (its read-modify-write). On one server it
    // checks a pooled connection out once, and the pool checks it with an UNWATCH and a
    // PING: the handler's too (the lock client's own PINGs keep its pub/sub alive).
    let mut handler_cmds = ["get", "set"]
        .iter()
        .filter_map(|command| sent.remove(*command))
        .sum::<u64>();
    if !settings.cluster {
        for check in ["unwatch", "ping"] {
            if let Some(calls) = sent.get_mut(check) {
                let handlers = (*calls).min(served.len() as u64);
                *calls -= handlers;
                handler_cmds += handlers;
            }
        }
        sent.retain(|_, calls| *calls > 0);
    }
    let total_cmds: u64 = sent.values().sum::<u64>() + handler_cmds;
    let mut cluster = if settings.cluster {
        Some(
            redis::cluster::ClusterClient::new(settings.redis.clone())?
                .get_async_connection()
                .await?,
        )
    } else {
        None
    };
    let mut final_counts = BTreeMap::new();
    for tenant in served
        .iter()
        .map(|s| s.tenant.clone())
        .collect::<std::collections::BTreeSet<_>>()
    {
        let mut get = redis::cmd("GET");
        get.arg(format!("orders:{tenant}"));
        let count: Option<u64> = match cluster.as_mut() {
            Some(cluster) => get.query_async(cluster).await?,
            None => get.query_async(&mut nodes[0]).await?,
        };
        final_counts.insert(tenant, count.unwrap_or(0));
    }

    let report = check(&served, &final_counts);
    let mut latencies = latencies;
    latencies.sort_unstable();
    let mut waits: Vec<u64> = served.iter().map(|s| s.waited_us).collect();
    waits.sort_unstable();
    let ms = |us: u64| (us as f64 / 100.0).round() / 10.0;
    let requests = served.len() + failures;

    println!("multi-instance lock demo");
    println!("  instances            {}", settings.targets.len());
    println!(
        "  requests             {requests} ({failures} failed) in {:.2} s",
        elapsed.as_secs_f64()
    );
    println!(
        "  tenants              {} ({} hot, half the traffic)",
        settings.tenants, settings.hot
    );
    println!("  overlapping handlers {}", report.overlaps);
    println!("  tokens out of order  {}", report.token_disorder);
    println!("  lost updates         {}", report.lost_updates);
    println!(
        "  latency p50 / p99    {} / {} ms",
        ms(percentile(&latencies, 50)),
        ms(percentile(&latencies, 99))
    );
    println!(
        "  lock wait p50 / p99  {} / {} ms",
        ms(percentile(&waits, 50)),
        ms(percentile(&waits, 99))
    );
    let per_request = |calls: u64| calls as f64 / requests.max(1) as f64;
    println!(
        "  redis commands sent  {:.2} per request: {:.2} for the handler's GET and SET (and, on \
         one server, its pool's check), {:.2} for the lock",
        per_request(total_cmds),
        per_request(handler_cmds),
        per_request(total_cmds - handler_cmds)
    );
    for (name, calls) in &sent {
        println!("    {name:<20} {:.2} per request", per_request(*calls));
    }
    println!(
        "{}",
        json!({
            "requests": requests,
            "instances": settings.targets.len(),
            "redis": if settings.cluster { "cluster" } else { "server" },
            "redis_nodes": settings.redis.len(),
            "tenants": settings.tenants,
            "overlaps": report.overlaps,
            "lost_updates": report.lost_updates,
            "token_disorder": report.token_disorder,
            "failed": failures,
            "p50_ms": ms(percentile(&latencies, 50)),
            "p99_ms": ms(percentile(&latencies, 99)),
            "wait_p50_ms": ms(percentile(&waits, 50)),
            "wait_p99_ms": ms(percentile(&waits, 99)),
            "redis_cmds_per_request": (total_cmds as f64 / requests.max(1) as f64 * 100.0).round() / 100.0,
        })
    );
    if report.overlaps + report.lost_updates + report.token_disorder + failures as u64 > 0 {
        std::process::exit(1);
    }
    Ok(())
}

struct Report {
    overlaps: u64,
    token_disorder: u64,
    lost_updates: u64,
}

/// Per tenant, in the order the handlers started: each must end before the next starts,
/// tokens must grow, and the final counter must equal the number of handler runs.
fn check(served: &[Served], final_counts: &BTreeMap<String, u64>) -> Report {
    let mut per_tenant: BTreeMap<&str, Vec<&Served>> = BTreeMap::new();
    for record in served {
        per_tenant.entry(&record.tenant).or_default().push(record);
    }
    let mut report = Report {
        overlaps: 0,
        token_disorder: 0,
        lost_updates: 0,
    };
    for (tenant, runs) in &mut per_tenant {
        runs.sort_by_key(|run| run.started_us);
        for pair in runs.windows(2) {
            if pair[0].ended_us > pair[1].started_us {
                report.overlaps += 1;
            }
            if pair[0].token >= pair[1].token {
                report.token_disorder += 1;
            }
        }
        let mut counts: Vec<u64> = runs.iter().map(|run| run.count).collect();
        counts.sort_unstable();
        counts.dedup();
        let stored = final_counts.get(*tenant).copied().unwrap_or(0);
        // Every run that read a count another run also read, or a counter short of the runs,
        // is an update lost.
        let duplicates = (runs.len() - counts.len()) as u64;
        report.lost_updates += duplicates.max((runs.len() as u64).saturating_sub(stored));
    }
    report
}

fn parse() -> Result<Settings, String> {
    let mut settings = Settings {
        redis: Vec::new(),
        cluster: false,
        targets: Vec::new(),
        requests: 3000,
        tenants: 40,
        hot: 3,
        concurrency: 48,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--cluster" {
            settings.cluster = true;
            continue;
        }
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let number = || {
            value
                .parse::<usize>()
                .map_err(|_| format!("{flag}: not a number"))
        };
        match flag.as_str() {
            "--redis" => settings.redis.push(value.clone()),
            "--targets" => settings.targets = value.split(',').map(str::to_owned).collect(),
            "--requests" => settings.requests = number()?,
            "--tenants" => settings.tenants = number()?,
            "--hot" => settings.hot = number()?,
            "--concurrency" => settings.concurrency = number()?,
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    if settings.redis.is_empty() {
        settings.redis.push("redis://127.0.0.1:6379".into());
    }
    if settings.targets.is_empty() || settings.hot == 0 || settings.hot >= settings.tenants {
        return Err("need --targets, and 0 < --hot < --tenants".into());
    }
    Ok(settings)
}
