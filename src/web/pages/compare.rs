//! `/compare?a=TRACE&b=TRACE`: two requests side by side by hop identity: what each hop
//! received, its own work, its calls and retries per callee, its flags and its time on the
//! critical path, the differences first in sentences ("+2 retries at orders → inventory",
//! "billing received 310 ms less in B"). `b=typical` picks a request of A's endpoint that
//! answered within its budget in the hour before A, the median by answer time, and
//! redirects to its permalink.

use std::collections::{BTreeMap, BTreeSet};

use askama::Template;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse as _, Redirect, Response};

use super::verdict::verdict;
use super::{PageError, enc, fmt_duration, fmt_opt_duration, html, trace_href};
use crate::core::analyze::hops::samples;
use crate::core::analyze::{Analysis, AnalyzeOptions, Flag, Outcome, analyze};
use crate::core::model::{Span, TraceId};
use crate::store::query::TraceQuery;
use crate::web::AppState;
use crate::web::api::{parse_trace_id, too_large_instead};
use crate::web::read::whole_traces;

/// How far back `b=typical` looks for a request of the same endpoint.
const TYPICAL_WINDOW_NANOS: u64 = 3_600_000_000_000;
/// Of how many recent requests within budget the median is taken.
const TYPICAL_CANDIDATES: u32 = 101;

/// What one request did at one hop identity.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Side {
    /// Hop spans of this identity in the request.
    pub hops: usize,
    /// The budget the first of them received.
    pub received_ms: Option<f64>,
    pub self_ms: f64,
    pub critical_ms: f64,
    /// Per callee: (calls, retries).
    pub calls: BTreeMap<String, (i64, i64)>,
    pub flags: BTreeMap<Flag, usize>,
}

/// One analysed request: its hop identities, by (service, operation).
pub fn sides(spans: &[Span], analysis: &Analysis) -> BTreeMap<(String, String), Side> {
    let retry = crate::core::analyze::edges::EDGE_COUNTED
        .iter()
        .position(|n| *n == "retry")
        .unwrap_or(0);
    let mut out: BTreeMap<(String, String), Side> = BTreeMap::new();
    for sample in samples(spans, analysis) {
        let side = out
            .entry((sample.service.clone(), sample.operation.clone()))
            .or_default();
        side.hops += 1;
        side.received_ms = side.received_ms.or(sample.budget_ms);
        side.self_ms += sample.self_ms;
        side.critical_ms += sample.critical.ms;
        for (flag, n) in &sample.flags {
            *side.flags.entry(*flag).or_default() += n;
        }
        for edge in &sample.calls {
            let callee = if edge.callee_operation.is_empty() {
                edge.callee_service.clone()
            } else {
                format!("{} {}", edge.callee_service, edge.callee_operation)
            };
            let entry = side.calls.entry(callee).or_default();
            entry.0 += edge.stats.calls;
            entry.1 += edge.stats.counts[retry];
        }
    }
    out
}

/// The differences of B against A worth a sentence: hops in one only, budgets received,
/// own work and critical-path time past τ, calls and retries per callee, flags.
pub fn differences(
    a: &BTreeMap<(String, String), Side>,
    b: &BTreeMap<(String, String), Side>,
    tolerance_ms: f64,
) -> Vec<String> {
    let mut out = Vec::new();
    let keys: BTreeSet<&(String, String)> = a.keys().chain(b.keys()).collect();
    let signed = |d: i64| {
        if d > 0 {
            format!("+{d}")
        } else {
            d.to_string()
        }
    };
    let more_less = |d: f64| if d > 0.0 { "more" } else { "less" };
    for key in keys {
        let name = format!("{} {}", key.0, key.1);
        let (sa, sb) = match (a.get(key), b.get(key)) {
            (Some(sa), Some(sb)) => (sa, sb),
            (Some(_), None) => {
                out.push(format!("{name} only in A"));
                continue;
            }
            (None, Some(_)) => {
                out.push(format!("{name} only in B"));
                continue;
            }
            (None, None) => continue,
        };
        if let (Some(ra), Some(rb)) = (sa.received_ms, sb.received_ms)
            && (rb - ra).abs() > tolerance_ms
        {
            out.push(format!(
                "{name} received {} {} in B",
                fmt_duration((rb - ra).abs()),
                more_less(rb - ra)
            ));
        }
        let own = sb.self_ms - sa.self_ms;
        if own.abs() > tolerance_ms {
            out.push(format!(
                "{name} spent {} {} on its own work in B",
                fmt_duration(own.abs()),
                more_less(own)
            ));
        }
        let callees: BTreeSet<&String> = sa.calls.keys().chain(sb.calls.keys()).collect();
        for callee in callees {
            let (ca, ra) = sa.calls.get(callee).copied().unwrap_or_default();
            let (cb, rb) = sb.calls.get(callee).copied().unwrap_or_default();
            if rb != ra {
                let d = rb - ra;
                out.push(format!(
                    "{} retr{} at {} → {callee} in B",
                    signed(d),
                    if d.abs() == 1 { "y" } else { "ies" },
                    key.0
                ));
            }
            let first = (cb - rb) - (ca - ra);
            if first != 0 {
                out.push(format!(
                    "{} call{} at {} → {callee} in B",
                    signed(first),
                    if first.abs() == 1 { "" } else { "s" },
                    key.0
                ));
            }
        }
        for flag in Flag::ALL {
            let (fa, fb) = (sa.flags.contains_key(&flag), sb.flags.contains_key(&flag));
            if fa != fb {
                out.push(format!(
                    "{name}: {} in {} only",
                    flag.as_str().replace('_', " "),
                    if fa { "A" } else { "B" }
                ));
            }
        }
    }
    out
}

pub struct Column {
    pub trace_id: String,
    pub href: String,
    pub verdict: String,
    pub outcome: &'static str,
}

pub struct Cell {
    pub a: String,
    pub b: String,
    pub differs: bool,
}

pub struct HopRow {
    pub service: String,
    pub operation: String,
    pub cells: Vec<Cell>,
}

#[derive(Template)]
#[template(path = "compare.html")]
pub struct ComparePage {
    pub nav: &'static str,
    pub a: Column,
    pub b: Column,
    pub differences: Vec<String>,
    pub columns: [&'static str; 6],
    pub rows: Vec<HopRow>,
}

/// The page for two analysed requests: pure.
pub fn page(
    (a_id, a_spans): (TraceId, &[Span]),
    (b_id, b_spans): (TraceId, &[Span]),
    options: &AnalyzeOptions,
) -> ComparePage {
    let (aa, ab) = (analyze(a_spans, options), analyze(b_spans, options));
    let (sa, sb) = (sides(a_spans, &aa), sides(b_spans, &ab));
    let tau = options.tolerance_ms;
    let column = |id: TraceId, spans: &[Span], analysis: &Analysis| Column {
        trace_id: id.to_hex(),
        href: trace_href(&id.to_hex()),
        verdict: verdict(spans, analysis),
        outcome: analysis.outcome.as_str(),
    };
    let empty = Side::default();
    let keys: BTreeSet<&(String, String)> = sa.keys().chain(sb.keys()).collect();
    let rows = keys
        .into_iter()
        .map(|key| {
            let (x, y) = (sa.get(key), sb.get(key));
            let (x_or, y_or) = (x.unwrap_or(&empty), y.unwrap_or(&empty));
            let absent = |side: Option<&Side>, text: String| match side {
                Some(_) => text,
                None => "—".into(),
            };
            let ms_cell = |f: &dyn Fn(&Side) -> Option<f64>| {
                let (va, vb) = (f(x_or), f(y_or));
                Cell {
                    a: absent(x, fmt_opt_duration(va)),
                    b: absent(y, fmt_opt_duration(vb)),
                    differs: x.is_none() != y.is_none()
                        || match (va, vb) {
                            (Some(p), Some(q)) => (p - q).abs() > tau,
                            (p, q) => p.is_some() != q.is_some(),
                        },
                }
            };
            let calls = |side: &Side| {
                let (calls, retries): (i64, i64) = side
                    .calls
                    .values()
                    .fold((0, 0), |(c, r), (dc, dr)| (c + dc, r + dr));
                (calls, retries)
            };
            let (ca, cb) = (calls(x_or), calls(y_or));
            let flags = |side: &Side| {
                let names: Vec<String> = side
                    .flags
                    .keys()
                    .map(|f| f.as_str().replace('_', " "))
                    .collect();
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            };
            HopRow {
                service: key.0.clone(),
                operation: key.1.clone(),
                cells: vec![
                    ms_cell(&|s| s.received_ms),
                    ms_cell(&|s| Some(s.self_ms)),
                    ms_cell(&|s| Some(s.critical_ms)),
                    Cell {
                        a: absent(x, ca.0.to_string()),
                        b: absent(y, cb.0.to_string()),
                        differs: ca.0 != cb.0,
                    },
                    Cell {
                        a: absent(x, ca.1.to_string()),
                        b: absent(y, cb.1.to_string()),
                        differs: ca.1 != cb.1,
                    },
                    Cell {
                        a: absent(x, flags(x_or)),
                        b: absent(y, flags(y_or)),
                        differs: x_or.flags.keys().ne(y_or.flags.keys()),
                    },
                ],
            }
        })
        .collect();
    ComparePage {
        nav: "traces",
        differences: differences(&sa, &sb, tau),
        a: column(a_id, a_spans, &aa),
        b: column(b_id, b_spans, &ab),
        columns: [
            "Received",
            "Own work",
            "Critical path",
            "Calls",
            "Retries",
            "Flags",
        ],
        rows,
    }
}

pub async fn compare(
    State(state): State<AppState>,
    Query(params): Query<BTreeMap<String, String>>,
) -> Result<Response, PageError> {
    let param = |name: &str| params.get(name).map(|v| v.trim()).unwrap_or("");
    if param("a").is_empty() || param("b").is_empty() {
        return Err(PageError::bad_request(
            "Give two traces to compare: /compare?a=TRACE_ID&b=TRACE_ID, or b=typical for a \
             request of the same endpoint that answered within its budget.",
        ));
    }
    let a = parse_trace_id(param("a"))?;
    if param("b") == "typical" {
        let b = typical(&state, a).await?;
        return Ok(Redirect::to(&format!(
            "/compare?a={}&b={}",
            enc(&a.to_hex()),
            enc(&b.to_hex())
        ))
        .into_response());
    }
    let b = parse_trace_id(param("b"))?;
    let read = whole_traces(&state, &[a, b])
        .await
        .map_err(|e| e.page("Compare", &too_large_instead(a)))?;
    let of = |id: TraceId| -> Vec<Span> {
        read.spans
            .iter()
            .filter(|s| s.trace_id == id)
            .cloned()
            .collect()
    };
    let (a_spans, b_spans) = (of(a), of(b));
    for (id, spans) in [(a, &a_spans), (b, &b_spans)] {
        if spans.is_empty() {
            return Err(PageError::not_found(
                "Trace not found",
                format!(
                    "No spans are stored for trace {id}: it may be older than the retention \
                     period or mistyped. Search traces to pick another."
                ),
            ));
        }
    }
    let options = state.analyze.clone();
    let page = tokio::task::spawn_blocking(move || page((a, &a_spans), (b, &b_spans), &options))
        .await
        .map_err(|_| PageError::bad_request("Comparing was interrupted; reload the page."))?;
    Ok(html(StatusCode::OK, &page))
}

/// A request of A's endpoint (its edge hop's, else its first root's service and name)
/// that answered within its budget in the hour before A: the median of the latest by
/// answer time.
async fn typical(state: &AppState, a: TraceId) -> Result<TraceId, PageError> {
    let read = whole_traces(state, &[a])
        .await
        .map_err(|e| e.page("Compare", &too_large_instead(a)))?;
    let analysis = analyze(&read.spans, &state.analyze);
    let Some(root) = analysis.edge.or((!analysis.rows.is_empty()).then_some(0)) else {
        return Err(PageError::not_found(
            "Trace not found",
            format!("No spans are stored for trace {a}; search traces to pick one."),
        ));
    };
    let root = &read.spans[analysis.rows[root].span];
    let (service, name) = (root.service.clone(), root.name.clone());
    let start = read
        .spans
        .iter()
        .map(|s| s.start_unix_nano)
        .min()
        .unwrap_or(0);
    drop(read);
    let mut candidates = state
        .store
        .search_traces(&TraceQuery {
            service: Some(service.clone()),
            operation: Some(name.clone()),
            outcome: Some(Outcome::Ok),
            since_unix_nano: Some(start.saturating_sub(TYPICAL_WINDOW_NANOS)),
            until_unix_nano: Some(start.saturating_add(1)),
            limit: TYPICAL_CANDIDATES,
            ..TraceQuery::default()
        })
        .await
        .map_err(PageError::from)?;
    candidates.retain(|c| c.trace_id != a);
    let answer =
        |s: &crate::core::analyze::summary::TraceSummary| s.answer_ms.unwrap_or(s.duration_ms);
    candidates.sort_by(|x, y| answer(x).total_cmp(&answer(y)));
    candidates
        .get(candidates.len() / 2)
        .map(|c| c.trace_id)
        .ok_or_else(|| {
            PageError::not_found(
                "No typical request",
                format!(
                    "No request of {service} {name} answered within its budget in the hour \
                     before this one (requests appear once analysed). Search traces to pick \
                     one to compare with."
                ),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::analyze::fixture::parse;

    fn sides_of(fixture: &str) -> BTreeMap<(String, String), Side> {
        let spans = parse(fixture);
        sides(&spans, &analyze(&spans, &AnalyzeOptions::default()))
    }

    #[test]
    fn the_differences_of_a_slow_request_against_a_healthy_one_read_as_sentences() {
        let healthy = sides_of(
            r#"
edge server "GET /checkout" 0 300 budget=800
  edge client "POST /orders" 10 280 budget=790
    orders server "POST /orders" 12 276 budget=788
      orders client "GET /stock" 20 100 budget=780
        inventory server "GET /stock" 21 98 budget=779
"#,
        );
        let slow = sides_of(
            r#"
edge server "GET /checkout" 0 900 budget=800
  edge client "POST /orders" 10 880 budget=790
    orders server "POST /orders" 12 876 budget=478
      orders client "GET /stock" 20 300 budget=470 http-status=504
        inventory server "GET /stock" 21 298 budget=469 http-status=504
      orders client "GET /stock" 330 300 budget=140 http-status=504
        inventory server "GET /stock" 331 298 budget=139 http-status=504
      orders client "GET /stock" 640 230 budget=-170
        inventory server "GET /stock" 641 228 budget=-171
"#,
        );
        let told = differences(&healthy, &slow, 50.0);
        for expected in [
            "orders POST /orders received 310 ms less in B",
            "+2 retries at orders → inventory GET /stock in B",
            "inventory GET /stock spent 726 ms more on its own work in B",
        ] {
            assert!(
                told.iter().any(|t| t == expected),
                "{expected:?} in {told:#?}"
            );
        }
        assert!(
            told.iter()
                .any(|t| t.starts_with("orders POST /orders: doomed in B only")),
            "{told:#?}"
        );
        assert!(differences(&healthy, &healthy, 50.0).is_empty());
    }
}
