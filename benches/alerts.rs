//! Alert evaluation at scale: 1,000 rules over 10,000 hop identities (BENCHMARKS.md,
//! "Alerts"). Run with `cargo bench --bench alerts`; not part of the product binary.
//!
//! 1. Pure: the rollups of every hop merged per window, then `alerts::eval::evaluate` for
//!    every rule, as the runner does; the median of 5 passes.
//! 2. End to end on SQLite: the same hops' rollups stored (one request per hop and minute,
//!    through `Store::write_summaries`), then `alerter::evaluate_once` twice: the first pass
//!    creates every instance, the second is the steady state.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use budgetscope::core::alerts::eval::{self, HopRollups, Windows};
use budgetscope::core::alerts::rules::{RuleSet, parse_file};
use budgetscope::core::analyze::Outcome;
use budgetscope::core::analyze::hops::{COUNTED, HopSample, Rollup};
use budgetscope::core::analyze::summary::TraceSummary;
use budgetscope::core::model::TraceId;
use budgetscope::pipeline::alerter::{AlerterOptions, evaluate_once};
use budgetscope::store::query::RollupQuery;

const SERVICES: usize = 100;
const OPERATIONS: usize = 100;
const MINUTES: u64 = 10;
const RULES: usize = 1_000;
const MINUTE: u64 = 60_000_000_000;

fn service(i: usize) -> String {
    format!("svc-{i:03}")
}

fn operation(i: usize) -> String {
    format!("GET /op-{i:02}")
}

/// One request of hop (s, o) in minute m; every 20th hop exceeds locally in half its
/// minutes.
fn sample(s: usize, o: usize, minute: u64) -> HopSample {
    let mut counts = [0; COUNTED.len()];
    if (s * OPERATIONS + o).is_multiple_of(20) && (minute / MINUTE).is_multiple_of(2) {
        counts[1] = 1;
    }
    HopSample {
        service: service(s),
        operation: operation(o),
        start_unix_nano: minute + 1_000_000,
        budget_ms: Some(200.0 + (o * 7 % 300) as f64),
        burn: Some(0.1 + (s % 10) as f64 / 20.0),
        self_ms: 5.0 + (o % 40) as f64,
        counts,
        wasted_ms: 0.0,
        flags: Default::default(),
        spent: None,
        critical: Default::default(),
        calls: Vec::new(),
        advice: Default::default(),
    }
}

fn rules() -> RuleSet {
    // (signal, op, threshold): only the local exceeds of every 20th hop pass theirs, so
    // about 1 % of (rule, hop) pairs are active, as in a healthy system with a few bad hops.
    let signals = [
        ("local_exceed_ratio", ">", 0.3),
        ("overspent_ratio", ">", 0.3),
        ("burn_p99", ">", 0.9),
        ("self_ms_p95", ">", 100.0),
        ("requests", "<", 1.0),
        ("inherited_exceed_count", ">", 0.0),
    ];
    let mut text = String::from("rules:\n");
    for i in 0..RULES {
        let (service, operation) = match i % 10 {
            0..=3 => (service(i % SERVICES), "*".to_string()),
            4..=6 => (format!("svc-0{}*", i % 10), "*".to_string()),
            7 | 8 => (service(i % SERVICES), operation(i % OPERATIONS)),
            _ => ("*".to_string(), format!("GET /op-{}*", i % 10)),
        };
        let (signal, op, threshold) = signals[i % signals.len()];
        let window = if i % 3 == 0 { "10m" } else { "5m" };
        text.push_str(&format!(
            "  - {{ name: rule-{i:04}, service: \"{service}\", operation: \"{operation}\", signal: {signal}, op: \"{op}\", threshold: {threshold}, window: {window}, for: 1m }}\n"
        ));
    }
    parse_file(&text).expect("bench rules parse")
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

fn pure(rules: &RuleSet, now: u64) {
    // Per-minute rollups, as the store returns them.
    let mut minutes: Vec<((String, String), Rollup)> = Vec::new();
    for m in 0..MINUTES {
        let minute = now - (m + 1) * MINUTE;
        for s in 0..SERVICES {
            for o in 0..OPERATIONS {
                let mut rollup = Rollup::default();
                for _ in 0..20 {
                    rollup.add(&sample(s, o, minute), 1);
                }
                minutes.push(((service(s), operation(o)), rollup));
            }
        }
    }
    let mut times = Vec::new();
    let mut eval_times = Vec::new();
    let mut instances = 0;
    for _ in 0..5 {
        let started = Instant::now();
        let mut windows: BTreeMap<u64, HopRollups> = BTreeMap::new();
        for length in [5, 10] {
            let mut merged = HopRollups::new();
            for (i, (key, rollup)) in minutes.iter().enumerate() {
                if (i / (SERVICES * OPERATIONS)) < length {
                    merged.entry(key.clone()).or_default().merge(rollup);
                }
            }
            windows.insert(length as u64, merged);
        }
        instances = 0;
        let evaluating = Instant::now();
        for rule in &rules.rules {
            let long = &windows[&(rule.window.as_secs() / 60)];
            let outcome = eval::evaluate(
                rule,
                now,
                Windows {
                    long,
                    short: None,
                    findings: None,
                },
                &BTreeMap::new(),
            );
            instances += outcome.instances.len();
        }
        eval_times.push(evaluating.elapsed());
        times.push(started.elapsed());
    }
    let ms = |times: &[Duration]| {
        times
            .iter()
            .map(|t| format!("{:.0}", t.as_secs_f64() * 1e3))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "pure: {RULES} rules over {} hops, {instances} instances: median {:.0} ms per evaluation ({} ms), of which evaluating the rules {:.0} ms ({} ms)",
        SERVICES * OPERATIONS,
        median(times.clone()).as_secs_f64() * 1e3,
        ms(&times),
        median(eval_times.clone()).as_secs_f64() * 1e3,
        ms(&eval_times),
    );
}

async fn end_to_end(rules: &RuleSet, now: u64) {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("bench.db").display());
    let store = budgetscope::store::open(&url).await.expect("store opens");
    let started = Instant::now();
    let mut id = 0u128;
    for m in 0..MINUTES {
        let minute = now - (m + 1) * MINUTE;
        for s in 0..SERVICES {
            id += 1;
            let samples: Vec<HopSample> = (0..OPERATIONS).map(|o| sample(s, o, minute)).collect();
            let summary = TraceSummary {
                trace_id: TraceId(id.to_be_bytes()),
                root_service: service(s),
                root_name: operation(0),
                start_unix_nano: minute,
                duration_ms: 10.0,
                budget_ms: Some(500.0),
                answer_ms: Some(10.0),
                outcome: Outcome::Ok,
                origins: Vec::new(),
                burner: None,
                flag_counts: BTreeMap::new(),
                span_count: OPERATIONS,
                services: vec![service(s)],
                operations: (0..OPERATIONS)
                    .map(|o| (service(s), operation(o)))
                    .collect(),
                version: budgetscope::core::analyze::AnalyzeOptions::default().version(),
            };
            store
                .write_summaries(&[(summary, samples)], &[])
                .await
                .expect("rollups stored");
        }
    }
    println!(
        "stored {} rollup rows in {:.1} s",
        MINUTES as usize * SERVICES * OPERATIONS,
        started.elapsed().as_secs_f64()
    );
    for minutes in [5, 10] {
        let started = Instant::now();
        let rows = store
            .hop_rollups(&RollupQuery {
                since_unix_nano: now - minutes * MINUTE,
                until_unix_nano: now + MINUTE,
                hourly: true,
                ..Default::default()
            })
            .await
            .expect("rollups read");
        println!(
            "reading a {minutes}-minute window: {} rows in {:.0} ms",
            rows.len(),
            started.elapsed().as_secs_f64() * 1e3
        );
    }
    let options = AlerterOptions {
        interval: Duration::from_secs(30),
        delay: Duration::ZERO,
        external_url: "http://localhost:8080".into(),
        analyze: Default::default(),
    };
    for pass in [
        "first (creates every instance)",
        "second (steady state)",
        "third",
    ] {
        let started = Instant::now();
        let report = evaluate_once(store.as_ref(), rules, &options, now + pass.len() as u64)
            .await
            .expect("evaluation");
        println!(
            "evaluate_once on SQLite, {pass}: {:.0} ms, {} instances, {} changes",
            started.elapsed().as_secs_f64() * 1e3,
            report.instances,
            report.changes
        );
    }
}

fn main() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_nanos() as u64;
    let now = now - now % MINUTE;
    let rules = rules();
    pure(&rules, now);
    tokio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(end_to_end(&rules, now));
}
