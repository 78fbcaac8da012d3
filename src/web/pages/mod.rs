//! The HTML pages: askama templates (`templates/`) filled from view models built here.
//!
//! Architecture invariant: every value that came from a span reaches HTML through askama's
//! escaping (templates never use `|safe` except for SVG from `web::charts`, which escapes its
//! own text) and every link is built from our own paths with `enc` for each component, so
//! no span name, attribute or service can inject markup or a `javascript:` URL. Every page
//! state (range, filters, sort, selected span, time mode) is in the URL.

pub mod advisor;
pub mod alert_forms;
pub mod alerts;
pub mod compare;
pub mod escape;
pub mod help;
pub mod hop;
pub mod large_trace;
pub mod map;
pub mod overview;
pub mod trace;
pub mod traces;
pub mod verdict;
pub mod whatif;

use std::time::UNIX_EPOCH;

use askama::Template;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::search::parse_time;
use crate::core::analyze::fmt_ms;
use crate::store::StoreError;
use crate::store::query::{MetricsQuery, RollupQuery};

pub const MINUTE: u64 = 60_000_000_000;

/// Renders a template into an HTML response.
pub fn html<T: Template>(status: StatusCode, page: &T) -> Response {
    match page.render() {
        Ok(body) => (
            status,
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            body,
        )
            .into_response(),
        Err(error) => {
            tracing::error!(%error, "a page template failed to render");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                "This page could not be drawn; the server log has the reason. Go back and retry.",
            )
                .into_response()
        }
    }
}

#[derive(Template)]
#[template(path = "error.html")]
pub struct ErrorPage {
    pub nav: &'static str,
    pub status: u16,
    pub title: String,
    pub message: String,
}

/// An error shown as a friendly page: what happened and what to do next.
#[derive(Debug)]
pub struct PageError {
    pub status: StatusCode,
    pub title: String,
    pub message: String,
}

impl PageError {
    pub fn bad_request(message: impl Into<String>) -> Self {
        PageError {
            status: StatusCode::BAD_REQUEST,
            title: "That link has a problem".into(),
            message: message.into(),
        }
    }

    pub fn not_found(title: impl Into<String>, message: impl Into<String>) -> Self {
        PageError {
            status: StatusCode::NOT_FOUND,
            title: title.into(),
            message: message.into(),
        }
    }
}

impl From<StoreError> for PageError {
    fn from(error: StoreError) -> Self {
        let api = ApiError::from(error);
        PageError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            title: "The database did not answer".into(),
            message: api.message().to_string(),
        }
    }
}

impl From<ApiError> for PageError {
    fn from(error: ApiError) -> Self {
        PageError::bad_request(error.message())
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        html(
            self.status,
            &ErrorPage {
                nav: "",
                status: self.status.as_u16(),
                title: self.title,
                message: self.message,
            },
        )
    }
}

/// The HTML 404 for unknown non-API paths.
pub async fn not_found(uri: axum::http::Uri) -> PageError {
    PageError::not_found(
        "No such page",
        format!(
            "There is no page at {}. Start from the overview, or search traces.",
            uri.path()
        ),
    )
}

/// Percent-encodes one URL component (path segment or query value); the same encoding
/// notifications use for their links.
/// A share of a bar's width (0–100 %) in tenths of a percent, clamped: the `g-l`, `g-w`
/// and `g-d` classes of `/static/geometry.css` (`assets.rs`) place bars and marks by it.
pub fn permille(percent: f64) -> u16 {
    (percent.clamp(0.0, 100.0) * 10.0).round() as u16
}

/// The largest `permille`.
pub const PERMILLE: u16 = 1000;

/// Waterfall rows are indented one step per depth up to this (`g-i` classes).
pub const MAX_INDENT: usize = 40;

pub fn enc(text: &str) -> String {
    crate::core::alerts::notify::path_component(text)
}

/// A query string from pairs, skipping empty values: `?a=1&b=x%20y` (or "" when none).
pub fn query_string<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let parts: Vec<String> = pairs
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("?{}", parts.join("&"))
    }
}

pub fn hop_href(service: &str, operation: &str, range_query: &str) -> String {
    format!("/hops/{}/{}{}", enc(service), enc(operation), range_query)
}

pub fn trace_href(trace_id: &str) -> String {
    format!("/traces/{}", enc(trace_id))
}

/// A duration as people read it: `840 ms`, `4.2 ms`, `1.5 s`, `12 s`.
/// A count with thousands separators (1,204).
pub fn fmt_count(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}

/// "metrics (every request, as the service saw it): 1,204 local exceeds, …; traces (sampled,
/// analysed): 37 local exceeds": a hop's deadline metrics beside
/// the local exceeds its traces show; `None` when it exported none.
pub fn reported_line(rollup: &crate::core::analyze::hops::Rollup) -> Option<String> {
    let r = &rollup.reported;
    (!r.is_empty()).then(|| {
        format!(
            "metrics (every request, as the service saw it): {} local exceeds, {} inherited, \
             {} requests; traces (sampled, analysed): {} local exceeds",
            fmt_count(r.local_exceeds),
            fmt_count(r.inherited_exceeds),
            fmt_count(r.received_count),
            fmt_count(rollup.count("local_exceed")),
        )
    })
}

/// Each hop's deadline metrics over `[since, until)` as rollup rows (nothing but
/// `reported` set), to merge with the trace rollups: one row per hop at `since`, or one
/// per hop and minute when `by_minute`.
pub async fn with_reported(
    store: &dyn crate::store::Store,
    since: u64,
    until: u64,
    service: Option<&str>,
    operation: Option<&str>,
    by_minute: bool,
) -> Result<Vec<crate::core::analyze::hops::HopRollupRow>, StoreError> {
    Ok(store
        .reported(&MetricsQuery {
            since_unix_nano: since,
            until_unix_nano: until,
            service,
            operation,
            per_minute: by_minute,
        })
        .await?
        .into_iter()
        .map(crate::core::analyze::hops::ReportedRow::into_rollup_row)
        .collect())
}

pub fn fmt_duration(ms: f64) -> String {
    if !ms.is_finite() {
        return "–".into();
    }
    if ms.abs() < 1000.0 {
        return format!("{} ms", fmt_ms(ms));
    }
    let seconds = ms / 1000.0;
    if seconds.abs() >= 100.0 {
        format!("{seconds:.0} s")
    } else {
        let text = format!("{seconds:.2}");
        let text = text.trim_end_matches('0').trim_end_matches('.');
        format!("{text} s")
    }
}

pub fn fmt_opt_duration(ms: Option<f64>) -> String {
    ms.map(fmt_duration).unwrap_or_else(|| "–".into())
}

/// A share as a percentage: `34 %`, `2.5 %`.
pub fn fmt_percent(share: Option<f64>) -> String {
    match share {
        Some(s) if s.is_finite() => {
            let p = s * 100.0;
            if p.abs() >= 10.0 {
                format!("{p:.0} %")
            } else {
                format!("{p:.1} %")
            }
        }
        _ => "–".into(),
    }
}

/// A UTC time as `2026-11-30 18:04:05 UTC`.
pub fn fmt_time(unix_nano: u64) -> String {
    let time = UNIX_EPOCH + std::time::Duration::from_nanos(unix_nano);
    let text = humantime::format_rfc3339_seconds(time).to_string();
    format!("{} UTC", text.replace('T', " ").trim_end_matches('Z'))
}

/// A short axis label for a bucket start: `18:04` within a day, `11-30 18:00` beyond.
pub fn fmt_axis_time(unix_nano: u64, long_range: bool) -> String {
    let text = fmt_time(unix_nano);
    // "2026-11-30 18:04:05 UTC"
    if long_range {
        text.get(5..16).unwrap_or("").to_string()
    } else {
        text.get(11..16).unwrap_or("").to_string()
    }
}

/// The preset ranges of the time picker.
pub const RANGES: [(&str, &str, u64); 5] = [
    ("15m", "15 min", 15),
    ("1h", "1 hour", 60),
    ("6h", "6 hours", 360),
    ("24h", "24 hours", 1440),
    ("7d", "7 days", 10_080),
];

/// The time range a page shows: a preset (`range=1h`) or custom (`since=…&until=…`).
#[derive(Debug, Clone)]
pub struct TimeRange {
    /// `15m` … `7d`, or `custom`.
    pub key: String,
    pub since_text: String,
    pub until_text: String,
    pub since: u64,
    pub until: u64,
}

/// One choice of the range picker.
pub struct RangeLink {
    pub label: &'static str,
    pub href: String,
    pub current: bool,
}

impl TimeRange {
    pub fn from_params(
        range: Option<&str>,
        since: Option<&str>,
        until: Option<&str>,
        now: u64,
    ) -> Result<TimeRange, PageError> {
        let since_text = since.unwrap_or("").trim().to_string();
        let until_text = until.unwrap_or("").trim().to_string();
        if !since_text.is_empty() || !until_text.is_empty() {
            let since = if since_text.is_empty() {
                now.saturating_sub(60 * MINUTE)
            } else {
                parse_time(&since_text, now)
                    .map_err(|m| PageError::bad_request(format!("From: {m}")))?
            };
            let until = if until_text.is_empty() {
                now
            } else {
                parse_time(&until_text, now)
                    .map_err(|m| PageError::bad_request(format!("To: {m}")))?
            };
            if until <= since {
                return Err(PageError::bad_request(
                    "The range ends before it starts; choose a To later than From.",
                ));
            }
            return Ok(TimeRange {
                key: "custom".into(),
                since_text,
                until_text,
                since,
                until,
            });
        }
        let key = range.filter(|r| !r.is_empty()).unwrap_or("1h");
        let minutes = RANGES
            .iter()
            .find(|(k, _, _)| *k == key)
            .map(|(_, _, m)| *m)
            .ok_or_else(|| {
                PageError::bad_request(format!(
                    "Unknown range {key:?}: use 15m, 1h, 6h, 24h or 7d, or give From and To."
                ))
            })?;
        Ok(TimeRange {
            key: key.to_string(),
            since_text: String::new(),
            until_text: String::new(),
            since: now.saturating_sub(minutes * MINUTE),
            until: now,
        })
    }

    /// The range a page's query asks for (`range`, or `since`/`until`), relative to now.
    pub fn from_query(
        params: &std::collections::BTreeMap<String, String>,
    ) -> Result<TimeRange, PageError> {
        TimeRange::from_params(
            params.get("range").map(String::as_str),
            params.get("since").map(String::as_str),
            params.get("until").map(String::as_str),
            crate::clock::now_unix_nano(),
        )
    }

    /// Query pairs that reproduce this range.
    pub fn pairs(&self) -> Vec<(&str, &str)> {
        if self.key == "custom" {
            vec![
                ("since", self.since_text.as_str()),
                ("until", self.until_text.as_str()),
            ]
        } else {
            vec![("range", self.key.as_str())]
        }
    }

    pub fn query(&self) -> String {
        query_string(self.pairs())
    }

    /// The picker's links for `path`, keeping `extra` parameters.
    pub fn links(&self, path: &str, extra: &[(&str, &str)]) -> Vec<RangeLink> {
        RANGES
            .iter()
            .map(|(key, label, _)| {
                let mut pairs = vec![("range", *key)];
                pairs.extend_from_slice(extra);
                RangeLink {
                    label,
                    href: format!("{path}{}", query_string(pairs)),
                    current: self.key == *key,
                }
            })
            .collect()
    }

    /// Minute-aligned bounds, as the rollups are kept.
    pub fn aligned(&self) -> (u64, u64) {
        (
            self.since - self.since % MINUTE,
            self.until.div_ceil(MINUTE) * MINUTE,
        )
    }

    /// A bucket size giving at most ~90 bars: 1m, 5m, 15m, 1h, 6h or 1d.
    pub fn step(&self) -> u64 {
        let (since, until) = self.aligned();
        [1, 5, 15, 60, 360, 1440]
            .into_iter()
            .map(|m| m * MINUTE)
            .find(|step| (until - since) / step <= 90)
            .unwrap_or(1440 * MINUTE)
    }

    /// The rollup rows of this range at the resolution its chart buckets need (hour rows
    /// only when every bucket is whole hours), optionally of one service or operation,
    /// and the deadline metrics' rows: per minute when `metrics_by_minute` (to chart
    /// them), else one per hop at the range's start.
    pub async fn rollups(
        &self,
        store: &dyn crate::store::Store,
        service: Option<&str>,
        operation: Option<&str>,
        metrics_by_minute: bool,
    ) -> Result<Vec<crate::core::analyze::hops::HopRollupRow>, StoreError> {
        let (since, until) = self.aligned();
        let hourly = self.step().is_multiple_of(60 * MINUTE);
        let mut rows = store
            .hop_rollups(&RollupQuery {
                since_unix_nano: since,
                until_unix_nano: until,
                service,
                operation,
                hourly,
            })
            .await?;
        rows.extend(
            with_reported(store, since, until, service, operation, metrics_by_minute).await?,
        );
        Ok(rows)
    }

    /// The trace search over this range, with `filters`.
    pub fn search_href(&self, filters: &[(&str, &str)]) -> String {
        let since = self.since_param();
        let mut pairs = filters.to_vec();
        pairs.push(("since", &since));
        pairs.push(("until", &self.until_text));
        format!("/traces{}", query_string(pairs))
    }

    /// The range's start as the search page's `since` value.
    pub fn since_param(&self) -> String {
        if self.key == "custom" {
            self.since_text.clone()
        } else {
            format!("-{}", self.key)
        }
    }

    pub fn description(&self) -> String {
        if self.key == "custom" {
            format!("{} to {}", fmt_time(self.since), fmt_time(self.until))
        } else {
            let label = RANGES
                .iter()
                .find(|(k, _, _)| *k == self.key)
                .map_or("", |(_, l, _)| *l);
            format!("last {label}")
        }
    }
}

/// Deadline-exceeded counts of rollup rows per bucket of `range.step()`, drawn as stacked
/// bars (local below, inherited above), with the non-empty buckets as table rows.
pub fn exceeded_chart(
    range: &TimeRange,
    rows: &[crate::core::analyze::hops::HopRollupRow],
    source: Exceeds,
) -> (String, Vec<(String, i64, i64)>) {
    use super::charts::{self, Series};
    let (since, until) = range.aligned();
    let step = range.step();
    let first = since - since % step;
    let buckets = (until - first).div_ceil(step) as usize;
    let (mut local, mut inherited) = (vec![0.0; buckets], vec![0.0; buckets]);
    for row in rows {
        let at = (row.minute_unix_nano.saturating_sub(first) / step) as usize;
        if at < buckets {
            let (l, i) = match source {
                Exceeds::Traces => (
                    row.rollup.count("local_exceed"),
                    row.rollup.count("inherited_exceed"),
                ),
                Exceeds::Metrics => (
                    row.rollup.reported.local_exceeds,
                    row.rollup.reported.inherited_exceeds,
                ),
            };
            local[at] += l as f64;
            inherited[at] += i as f64;
        }
    }
    let long_range = until - since > 1440 * MINUTE;
    let labels: Vec<String> = (0..buckets)
        .map(|i| fmt_axis_time(first + i as u64 * step, long_range))
        .collect();
    let table = labels
        .iter()
        .zip(local.iter().zip(&inherited))
        .filter(|(_, (l, i))| **l > 0.0 || **i > 0.0)
        .map(|(label, (l, i))| (label.clone(), *l as i64, *i as i64))
        .collect();
    let chart = charts::stacked_bars(
        match source {
            Exceeds::Traces => "Deadline exceeded per interval, local vs inherited",
            Exceeds::Metrics => {
                "Deadline exceeded per interval from the deadline metrics, local vs inherited"
            }
        },
        &labels,
        &[
            Series {
                name: "local: the deadline passed in this hop",
                colour: charts::LOCAL,
                values: local,
            },
            Series {
                name: "inherited: arrived already spent",
                colour: charts::INHERITED,
                values: inherited,
            },
        ],
    );
    (chart, table)
}

/// Whose exceeds a chart counts: the analysed traces' flags, or the deadline metrics the
/// hops export (every request, when traces are sampled).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exceeds {
    Traces,
    Metrics,
}

/// A flag badge: the flag's name (text, never colour alone) and its message.
#[derive(Debug, Clone)]
pub struct Badge {
    pub flag: &'static str,
    pub label: String,
    pub title: String,
}

impl Badge {
    pub fn new(flag: &'static str, count: Option<usize>, title: String) -> Badge {
        let label = match count {
            Some(n) if n > 1 => format!("{} ×{n}", flag.replace('_', " ")),
            _ => flag.replace('_', " "),
        };
        Badge { flag, label, title }
    }
}

/// What each flag means in one line, for badge tooltips and the legend.
pub fn flag_meaning(flag: &str) -> &'static str {
    match flag {
        "inflated" => "forwarded more budget than it had left",
        "dropped" => "called on without passing a budget",
        "overspent" => "kept working past its own deadline",
        "inherited_exceed" => "arrived with its budget already spent upstream",
        "local_exceed" => "its deadline passed while it was working",
        "doomed" => "called on when its own budget was already spent",
        "refused" => "declined work it could not finish in time (good)",
        "retry" => "a repeated call to the same target",
        "unsafe_retry" => "retried a non-idempotent call",
        "wasted" => "kept working after its caller gave up",
        "missing_parent" => "its parent span was never received",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_are_percent_encoded() {
        assert_eq!(enc("GET /stock?x=<1>"), "GET%20%2Fstock%3Fx%3D%3C1%3E");
        assert_eq!(enc("javascript:alert(1)"), "javascript%3Aalert%281%29");
        assert_eq!(
            query_string([("a", "1"), ("b", ""), ("c", "x y")]),
            "?a=1&c=x%20y"
        );
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(fmt_duration(840.0), "840 ms");
        assert_eq!(fmt_duration(4.25), "4.2 ms");
        assert_eq!(fmt_duration(1500.0), "1.5 s");
        assert_eq!(fmt_duration(2000.0), "2 s");
        assert_eq!(fmt_duration(123_456.0), "123 s");
        assert_eq!(fmt_percent(Some(0.345)), "34 %");
    }

    #[test]
    fn ranges_parse_presets_and_custom_bounds() {
        let now = 100 * 1440 * MINUTE;
        let range = TimeRange::from_params(Some("6h"), None, None, now).unwrap();
        assert_eq!(range.since, now - 360 * MINUTE);
        assert_eq!(range.query(), "?range=6h");
        assert_eq!(range.step(), 5 * MINUTE);
        let custom = TimeRange::from_params(None, Some("-2h"), Some("-1h"), now).unwrap();
        assert_eq!(custom.key, "custom");
        assert_eq!(custom.until - custom.since, 60 * MINUTE);
        assert_eq!(custom.query(), "?since=-2h&until=-1h");
        let error = TimeRange::from_params(Some("2y"), None, None, now).unwrap_err();
        assert!(error.message.contains("use 15m, 1h"), "{}", error.message);
        let error = TimeRange::from_params(None, Some("-1h"), Some("-2h"), now).unwrap_err();
        assert!(error.message.contains("later than From"));
    }
}
