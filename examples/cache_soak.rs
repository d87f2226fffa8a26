//! Cache soak: 9,000 ids (half found, 1 KiB values; half not found) refreshed round after round
//! on the real clock, printing the cache's own entry count and weight and the process's RSS.
//! A bounded cache shows flat figures after the first round. Run by `scripts/soak-cache.sh`.
//!
//!   cargo run --example cache_soak -- [ROUNDS]   (default 300)

use std::time::{Duration, Instant};

use podmutator_aws::secretsmanager::{CachePolicy, CachingSource};
use podmutator_core::secrets::source::{SecretSource, StaticSource};

const IDS: usize = 9_000;

/// Resident set size in KiB, from /proc (Linux only; 0 elsewhere).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), String> {
    let rounds: usize = match std::env::args().nth(1) {
        None => 300,
        Some(n) => n
            .parse()
            .map_err(|_| format!("ROUNDS must be a number, got {n:?}"))?,
    };
    let ids: Vec<String> = (0..IDS)
        .map(|i| format!("u__org__o__domain__d__project__p__key__k{i}"))
        .collect();
    let value = "x".repeat(1024);
    let mut inner = StaticSource::default();
    for id in &ids[..IDS / 2] {
        inner = inner.with(id, &value);
    }
    // The production bounds (embedded.cacheMaxEntries 10,000, cacheMaxBytes 16 MiB) with a TTL
    // short enough that every round refreshes every id.
    let ttl = Duration::from_millis(5);
    let source = CachingSource::new(
        inner,
        CachePolicy {
            ttl,
            negative_ttl: ttl,
            max_entries: 10_000,
            max_bytes: 16 << 20,
        },
    );
    println!("round\trefreshes\tentries\tweight_bytes\trss_kib");
    let started = Instant::now();
    let mut refreshes = 0u64;
    for round in 1..=rounds {
        let got = source
            .fetch_many(&ids)
            .await
            .map_err(|e| format!("fetch failed: {e}"))?;
        refreshes += u64::from(got.backend_ids);
        if round == 1 || round % 25 == 0 || round == rounds {
            println!(
                "{round}\t{refreshes}\t{}\t{}\t{}",
                source.len(),
                source.weighted_size(),
                rss_kib()
            );
        }
        tokio::time::sleep(ttl * 2).await;
    }
    eprintln!(
        "{rounds} rounds, {refreshes} refreshes in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
