//! Backtest: when a rule would have fired over past hop rollups, evaluated once a minute.
//! Pure: per-minute rollups in, episodes out. Shown before a rule is saved.

use std::collections::BTreeMap;

use serde::Serialize;

use super::eval::{self, Change, HopKey, HopRollups, Instance, Severity, Windows};
use super::rules::Rule;
use crate::core::advice::{finding_counts, findings};
use crate::core::analyze::hops::Rollup;

const MINUTE: u64 = 60_000_000_000;

/// Per hop, the rollup of each minute (keyed by the minute's start).
pub type MinuteRollups = BTreeMap<HopKey, BTreeMap<u64, Rollup>>;

/// One time a hop's instance fired.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Episode {
    pub service: String,
    pub operation: String,
    pub fired_at: u64,
    /// `None` while it still fired at the end of the backtest.
    pub resolved_at: Option<u64>,
    /// The highest severity it reached.
    pub severity: Severity,
    /// The value furthest past the threshold while it fired.
    pub worst_value: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Backtest {
    pub episodes: Vec<Episode>,
    /// Hops the rule selected.
    pub hops: usize,
    /// Evaluations run (minutes).
    pub evaluations: usize,
}

/// A running sum of the minutes in a sliding window.
fn slide(sum: &mut HopRollups, minutes: &MinuteRollups, add: u64, remove: Option<u64>) {
    for (key, by_minute) in minutes {
        if let Some(rollup) = by_minute.get(&add) {
            sum.entry(key.clone()).or_default().merge(rollup);
        }
        if let Some(rollup) = remove.and_then(|m| by_minute.get(&m)) {
            sum.entry(key.clone()).or_default().unmerge(rollup);
        }
    }
}

fn window_minutes(length: std::time::Duration) -> u64 {
    u64::try_from(length.as_nanos())
        .unwrap_or(u64::MAX)
        .div_ceil(MINUTE)
        .max(1)
}

/// Evaluates `rule` (as if it were not paused) at every minute boundary `t` of `[from,
/// to)`, its window covering the whole minutes before `t`. `minutes` holds the selected
/// hops' rollups from `from − window` on.
pub fn backtest(
    rule: &Rule,
    minutes: &MinuteRollups,
    from: u64,
    to: u64,
    tolerance_ms: f64,
) -> Backtest {
    let mut rule = rule.clone();
    rule.paused = false;
    let (from, to) = (from - from % MINUTE, to - to % MINUTE);
    let long_len = window_minutes(rule.window);
    let short_len = rule.short_window.map(window_minutes);
    let (mut long, mut short) = (HopRollups::new(), HopRollups::new());
    // Fill the windows up to `from`.
    for m in 0..long_len {
        let minute = from - (long_len - m) * MINUTE;
        slide(&mut long, minutes, minute, None);
        if short_len.is_some_and(|s| m >= long_len - s) {
            slide(&mut short, minutes, minute, None);
        }
    }
    let mut previous: BTreeMap<HopKey, Instance> = BTreeMap::new();
    let mut open: BTreeMap<HopKey, usize> = BTreeMap::new();
    let mut result = Backtest {
        hops: minutes.len(),
        ..Backtest::default()
    };
    let mut t = from;
    while t <= to {
        if t > from {
            let last = t - MINUTE;
            slide(
                &mut long,
                minutes,
                last,
                last.checked_sub(long_len * MINUTE),
            );
            if let Some(s) = short_len {
                slide(&mut short, minutes, last, last.checked_sub(s * MINUTE));
            }
        }
        // A finding rule replays the hops' own findings; the edges' are not in `minutes`.
        let findings = rule
            .signal
            .finding_kind()
            .map(|_| finding_counts(&findings(&long, &BTreeMap::new(), tolerance_ms)));
        let windows = Windows {
            long: &long,
            short: short_len.map(|_| &short),
            findings: findings.as_ref(),
        };
        let outcome = eval::evaluate(&rule, t, windows, &previous);
        result.evaluations += 1;
        for (change, instance) in &outcome.changes {
            match change {
                Change::Fired => {
                    open.insert(instance.key(), result.episodes.len());
                    result.episodes.push(Episode {
                        service: instance.service.clone(),
                        operation: instance.operation.clone(),
                        fired_at: t,
                        resolved_at: None,
                        severity: instance.severity,
                        worst_value: instance.value,
                    });
                }
                Change::Resolved => {
                    if let Some(i) = open.remove(&instance.key()) {
                        result.episodes[i].resolved_at = Some(t);
                    }
                }
                Change::SeverityChanged | Change::Repeated => {}
            }
        }
        for key in &outcome.removed {
            previous.remove(key);
        }
        for instance in outcome.instances {
            if let Some(&i) = open.get(&instance.key()) {
                let episode = &mut result.episodes[i];
                if instance.severity == Severity::Critical {
                    episode.severity = Severity::Critical;
                }
                if let Some(v) = instance.value
                    && episode.worst_value.is_none_or(|w| rule.op.holds(v, w))
                {
                    episode.worst_value = Some(v);
                }
            }
            previous.insert(instance.key(), instance);
        }
        t += MINUTE;
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::alerts::rules::parse_file;

    #[test]
    fn a_burst_of_local_exceeds_fires_once_and_resolves_after_it() {
        let rule = parse_file(
            "rules:\n  - { name: r, signal: local_exceed_ratio, op: \">\", threshold: 0.1, window: 5m, for: 2m }\n",
        )
        .unwrap()
        .rules
        .remove(0);
        let start = 1_000 * MINUTE;
        // 30 minutes of 100 requests a minute; minutes 10–14 have 50 local exceeds each.
        let mut by_minute = BTreeMap::new();
        for m in 0..30 {
            let mut rollup = Rollup {
                requests: 100,
                ..Rollup::default()
            };
            if (10..15).contains(&m) {
                rollup.counts[1] = 50;
            }
            by_minute.insert(start + m * MINUTE, rollup);
        }
        let minutes = BTreeMap::from([(("inventory".to_string(), "GET /".to_string()), by_minute)]);
        let result = backtest(
            &rule,
            &minutes,
            start + 5 * MINUTE,
            start + 30 * MINUTE,
            50.0,
        );
        assert_eq!(result.evaluations, 26);
        assert_eq!(result.hops, 1);
        assert_eq!(result.episodes.len(), 1, "{result:?}");
        let episode = &result.episodes[0];
        // At t = 11 the window holds one bad minute (50 of 500, not over 10 %); at t = 12
        // two (20 %): pending, and firing 2 minutes later.
        assert_eq!(episode.fired_at, start + 14 * MINUTE);
        // At t = 19 the window holds only the last bad minute (14): 10 %, no longer over.
        assert_eq!(episode.resolved_at, Some(start + 19 * MINUTE));
        assert_eq!(episode.worst_value, Some(0.5));
    }
}
