//! The flags, per-hop numbers and outcome of docs/budget-semantics.md, one function per rule.
//!
//! Every timestamp comparison here is between spans of one service (a hop and its own
//! calls); across services only budgets and durations are compared, so clock skew between
//! hosts cannot raise a flag.

use std::collections::{BTreeMap, HashMap};

use super::tree::Tree;
use super::{Analysis, AnalyzeOptions, Exceed, Flag, FlagNote, Outcome, Role, Row, fmt_ms};
use crate::core::model::{AttrValue, Span, attr};

/// What the rules work on, computed once.
struct Facts<'a> {
    spans: &'a [Span],
    tree: &'a Tree,
    tau: f64,
    budget: Vec<Option<f64>>,
    duration: Vec<f64>,
    /// `D_h` for hops with a budget, in their own service's timeline.
    deadline: Vec<Option<f64>>,
    /// Calls whose owner hop is this span, by start time.
    owned_calls: Vec<Vec<usize>>,
}

impl Facts<'_> {
    fn owner_deadline(&self, i: usize) -> Option<f64> {
        self.tree.owner[i].and_then(|h| self.deadline[h])
    }

    fn has_child_hop(&self, c: usize) -> bool {
        self.tree.child_hops(c).next().is_some()
    }

    /// Who a call talks to, for messages: its child hop's service, else what the call
    /// span says about its peer, else its name.
    fn target_label(&self, c: usize) -> String {
        if let Some(h) = self.tree.child_hops(c).next() {
            return self.spans[h].service.clone();
        }
        peer_label(&self.spans[c])
    }

    /// The retry target (docs/budget-semantics.md, "retry").
    fn retry_target(&self, c: usize) -> String {
        if let Some(h) = self.tree.child_hops(c).next() {
            return format!(
                "hop\u{0}{}\u{0}{}",
                self.spans[h].service, self.spans[h].name
            );
        }
        let span = &self.spans[c];
        let peer = text(span, "server.address")
            .or_else(|| text(span, "peer.service"))
            .or_else(
                || match (text(span, "rpc.service"), text(span, "rpc.method")) {
                    (Some(service), Some(method)) => Some(format!("{service}/{method}")),
                    _ => None,
                },
            )
            .or_else(|| {
                text(span, "url.full")
                    .map(|url| url.split(['?', '#']).next().unwrap_or("").to_string())
            })
            .unwrap_or_default();
        format!("call\u{0}{}\u{0}{peer}", span.name)
    }
}

/// Every attribute the rules read: spans analysed with only these attributes get the same
/// flags, summary and hop samples (`crate::pipeline::held` holds only these).
pub const ATTRIBUTES_READ: [&str; 13] = [
    "server.address",
    "peer.service",
    "rpc.service",
    "rpc.method",
    "url.full",
    "rpc.grpc.status_code",
    "http.response.status_code",
    "http.status_code",
    "error.type",
    "http.request.method",
    "http.method",
    "http.request.header.idempotency-key",
    "http.request.header.x-idempotency-key",
];

/// The one way the rules read an attribute.
fn read<'a>(span: &'a Span, key: &str) -> Option<&'a AttrValue> {
    debug_assert!(
        ATTRIBUTES_READ.contains(&key),
        "{key} is not in ATTRIBUTES_READ"
    );
    attr(&span.attributes, key)
}

/// Who a call without an instrumented callee talks to: what the call span says about its
/// peer, else its name.
pub(super) fn peer_label(span: &Span) -> String {
    ["server.address", "peer.service", "rpc.service"]
        .iter()
        .find_map(|key| text(span, key))
        .unwrap_or_else(|| span.name.clone())
}

fn text(span: &Span, key: &str) -> Option<String> {
    match read(span, key)? {
        AttrValue::String(s) if !s.is_empty() => Some(s.clone()),
        AttrValue::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

fn number(span: &Span, key: &str) -> Option<i64> {
    match read(span, key)? {
        AttrValue::Int(i) => Some(*i),
        AttrValue::String(s) => s.trim().parse().ok(),
        AttrValue::Double(d) if d.fract() == 0.0 => Some(*d as i64),
        _ => None,
    }
}

/// gRPC DEADLINE_EXCEEDED, HTTP 504, or an `error.type` naming a deadline or timeout.
pub(super) fn is_deadline_class(span: &Span) -> bool {
    let grpc = match read(span, "rpc.grpc.status_code") {
        Some(AttrValue::String(s)) => {
            s.trim() == "4" || s.trim().eq_ignore_ascii_case("DEADLINE_EXCEEDED")
        }
        _ => number(span, "rpc.grpc.status_code") == Some(4),
    };
    let http = number(span, "http.response.status_code")
        .or_else(|| number(span, "http.status_code"))
        == Some(504);
    let error_type = text(span, "error.type").is_some_and(|t| {
        let t = t.to_ascii_lowercase();
        t.contains("deadline") || t.contains("timeout")
    });
    grpc || http || error_type
}

/// A span that ended in failure: an error status, a gRPC status other than OK, an HTTP
/// status of 500 or more, or a deadline-class answer.
pub fn span_failed(span: &Span) -> bool {
    let grpc = match read(span, "rpc.grpc.status_code") {
        Some(AttrValue::String(s)) => {
            let s = s.trim();
            !(s == "0" || s.eq_ignore_ascii_case("OK"))
        }
        Some(_) => number(span, "rpc.grpc.status_code").is_some_and(|c| c != 0),
        None => false,
    };
    let http = number(span, "http.response.status_code")
        .or_else(|| number(span, "http.status_code"))
        .is_some_and(|c| c >= 500);
    span.status.code == crate::core::model::StatusCode::Error
        || grpc
        || http
        || is_deadline_class(span)
}

/// An attempt whose effect the caller cannot know: it timed out, or it recorded no answer.
fn outcome_unknown(span: &Span) -> bool {
    let answered = [
        "http.response.status_code",
        "http.status_code",
        "rpc.grpc.status_code",
    ]
    .iter()
    .any(|key| read(span, key).is_some());
    is_deadline_class(span) || (!answered && span.status.code != crate::core::model::StatusCode::Ok)
}

fn method(span: &Span) -> Option<String> {
    text(span, "http.request.method")
        .or_else(|| text(span, "http.method"))
        .map(|m| m.to_ascii_uppercase())
}

fn has_idempotency_key(span: &Span) -> bool {
    [
        "http.request.header.idempotency-key",
        "http.request.header.x-idempotency-key",
    ]
    .iter()
    .any(|key| read(span, key).is_some())
}

fn is_unsafe_method(span: &Span) -> Option<String> {
    method(span)
        .filter(|m| m == "POST" || m == "PATCH")
        .filter(|_| !has_idempotency_key(span))
}

struct Draft {
    flags: Vec<FlagNote>,
    exceed: Option<Exceed>,
    attempt: Option<u32>,
    wasted_ms: Option<f64>,
    self_ms: Option<f64>,
    available_ms: Option<f64>,
}

impl Draft {
    fn flag(&mut self, flag: Flag, message: String) {
        self.flags.push(FlagNote { flag, message });
    }
}

pub(super) fn evaluate(spans: &[Span], tree: &Tree, options: &AnalyzeOptions) -> Analysis {
    let n = spans.len();
    let budget: Vec<Option<f64>> = spans
        .iter()
        .map(|s| s.budget.as_ref().map(|b| b.ms))
        .collect();
    let deadline = (0..n)
        .map(|i| {
            if tree.role[i] == Role::Hop {
                budget[i].map(|b| tree.start_ms[i] + b)
            } else {
                None
            }
        })
        .collect();
    let mut owned_calls: Vec<Vec<usize>> = vec![Vec::new(); n];
    for &i in &tree.order {
        if tree.role[i] == Role::Call
            && let Some(h) = tree.owner[i]
        {
            owned_calls[h].push(i);
        }
    }
    for calls in &mut owned_calls {
        calls.sort_by(|a, b| tree.start_ms[*a].total_cmp(&tree.start_ms[*b]));
    }
    let facts = Facts {
        spans,
        tree,
        tau: options.tolerance_ms,
        budget,
        duration: (0..n).map(|i| tree.duration_ms(i)).collect(),
        deadline,
        owned_calls,
    };

    let mut drafts: Vec<Draft> = (0..n)
        .map(|i| Draft {
            flags: Vec::new(),
            exceed: None,
            attempt: None,
            wasted_ms: None,
            self_ms: None,
            available_ms: match tree.role[i] {
                Role::Hop => facts.budget[i],
                _ => facts.owner_deadline(i).map(|d| d - tree.start_ms[i]),
            },
        })
        .collect();

    // Calls first: a hop's rules read its calls' flags (doomed, inflated).
    for i in 0..n {
        if tree.missing_parent[i] {
            let parent = spans[i]
                .parent_span_id
                .map(|p| p.to_hex())
                .unwrap_or_default();
            drafts[i].flag(
                Flag::MissingParent,
                format!("parent {parent} is not in this trace; shown as a root"),
            );
        }
        if tree.role[i] == Role::Call {
            call_rules(&facts, i, &mut drafts[i]);
        }
    }
    for i in 0..n {
        if tree.role[i] == Role::Hop {
            hop_vs_caller(&facts, i, &mut drafts[i]);
            hop_budget(&facts, i, &mut drafts);
            drafts[i].self_ms = Some(self_ms(&facts, i));
        }
    }
    origins(&facts, &mut drafts);
    retries(&facts, &mut drafts);
    summarise(&facts, drafts, options)
}

/// The rest of "every exceeded request has an origin" (docs/budget-semantics.md): a hop whose
/// budget ran out while it waited downstream holds the exceed itself when nothing
/// downstream can: the callee was sent more than was left (`inflated`), or it answered
/// within its own budget and nothing under it exceeded (the time was lost between them);
/// and a hop cancelled at its deadline holds it. Children are decided before parents.
fn origins(facts: &Facts, drafts: &mut [Draft]) {
    let tree = facts.tree;
    let n = facts.spans.len();
    // Whether a span or anything under it holds an exceed, or refused on purpose.
    let mut below = vec![false; n];
    for &i in tree.order.iter().rev() {
        let own =
            drafts[i].exceed.is_some() || drafts[i].flags.iter().any(|f| f.flag == Flag::Refused);
        below[i] = own || tree.children[i].iter().any(|&c| below[c]);
        // A hop that refused is an origin already; one with an exceed has its reason.
        if tree.role[i] != Role::Hop || own {
            continue;
        }
        if let Some(message) = origin_reason(facts, i, drafts, &below) {
            drafts[i].exceed = Some(Exceed::Local);
            drafts[i].flag(Flag::LocalExceed, message);
            below[i] = true;
        }
    }
}

/// Why hop `h` (with a budget left when it started) is where its request ran out, by the
/// origin conditions beyond its own work and doomed calls; `None` when none holds.
fn origin_reason(facts: &Facts, h: usize, drafts: &[Draft], below: &[bool]) -> Option<String> {
    let (tree, tau) = (facts.tree, facts.tau);
    let received = facts.budget[h].filter(|b| *b > 0.0)?;
    let deadline = tree.start_ms[h] + received;
    let waited_on: Vec<usize> = facts.owned_calls[h]
        .iter()
        .copied()
        .filter(|&c| {
            facts.has_child_hop(c) && tree.start_ms[c] <= deadline && deadline <= tree.end_ms[c]
        })
        .collect();
    if tree.end_ms[h] > deadline + tau {
        let flagged = |c: usize, flag: Flag| drafts[c].flags.iter().any(|f| f.flag == flag);
        if let Some(&c) = waited_on.iter().find(|&&c| flagged(c, Flag::Inflated)) {
            return Some(format!(
                "deadline passed while waiting on {}, which was sent more time than was left",
                facts.target_label(c)
            ));
        }
        let answered_in_time = |c: usize| {
            let callees: Vec<usize> = tree.children[c]
                .iter()
                .copied()
                .filter(|&k| tree.role[k] == Role::Hop)
                .collect();
            !callees.is_empty()
                && callees.iter().all(|&k| {
                    !below[k] && facts.budget[k].is_some_and(|b| facts.duration[k] <= b + tau)
                })
        };
        if let Some(&c) = waited_on.iter().find(|&&c| answered_in_time(c)) {
            return Some(format!(
                "deadline passed while waiting on {}, which answered within its own budget: the time was lost between them",
                facts.target_label(c)
            ));
        }
    }
    // Waiting until within τ of the deadline counts as waiting at it: a caller that gives
    // up on its callee just before its deadline (keeping a reserve to answer) only passes
    // the callee's exceed on.
    let waited_near = facts.owned_calls[h].iter().any(|&c| {
        facts.has_child_hop(c)
            && tree.start_ms[c] <= deadline + tau
            && deadline - tau <= tree.end_ms[c]
    });
    let end_to_deadline = tree.end_ms[h] - deadline;
    if !waited_near && is_deadline_class(&facts.spans[h]) && end_to_deadline.abs() <= tau {
        return Some(format!(
            "cancelled at its deadline (ended {} ms {} it, with a deadline status)",
            fmt_ms(end_to_deadline.abs()),
            if end_to_deadline >= 0.0 {
                "after"
            } else {
                "before"
            }
        ));
    }
    None
}

/// `inflated` and `doomed` on a call, from what its owner hop had left when it called.
fn call_rules(facts: &Facts, c: usize, draft: &mut Draft) {
    let Some(available) = draft.available_ms else {
        return;
    };
    if let Some(forwarded) = facts.budget[c]
        && forwarded > available + facts.tau
    {
        draft.flag(
            Flag::Inflated,
            format!(
                "forwarded {} ms with {} ms left",
                fmt_ms(forwarded),
                fmt_ms(available)
            ),
        );
    }
    if available < -facts.tau {
        draft.flag(
            Flag::Doomed,
            format!(
                "called {} {} ms after its deadline",
                facts.target_label(c),
                fmt_ms(-available)
            ),
        );
    }
}

/// `inflated`, `dropped` and `wasted` on a hop, against the call that reached it.
fn hop_vs_caller(facts: &Facts, h: usize, draft: &mut Draft) {
    let Some(call) = facts.tree.parent[h].filter(|p| facts.tree.role[*p] == Role::Call) else {
        return;
    };
    if let Some(forwarded) = facts.budget[call] {
        match facts.budget[h] {
            Some(received) if received > forwarded + facts.tau => draft.flag(
                Flag::Inflated,
                format!(
                    "received {} ms, caller sent {} ms",
                    fmt_ms(received),
                    fmt_ms(forwarded)
                ),
            ),
            Some(_) => {}
            None => draft.flag(
                Flag::Dropped,
                format!(
                    "budget lost between {} and {}",
                    facts.spans[call].service, facts.spans[h].service
                ),
            ),
        }
    }
    let extra = facts.duration[h] - facts.duration[call];
    if extra > facts.tau {
        draft.wasted_ms = Some(extra);
        draft.flag(
            Flag::Wasted,
            format!("{} ms of work nobody read", fmt_ms(extra)),
        );
    }
}

/// `overspent`, `inherited_exceed`, `local_exceed` and `refused` from the hop's own budget.
fn hop_budget(facts: &Facts, h: usize, drafts: &mut [Draft]) {
    let Some(received) = facts.budget[h] else {
        return;
    };
    let (tree, tau) = (facts.tree, facts.tau);
    let duration = facts.duration[h];
    if received <= 0.0 {
        drafts[h].exceed = Some(Exceed::Inherited);
        drafts[h].flag(
            Flag::InheritedExceed,
            format!(
                "arrived with {} ms: already spent upstream",
                fmt_ms(received)
            ),
        );
        return;
    }
    if duration > received + tau {
        drafts[h].flag(
            Flag::Overspent,
            format!(
                "answered {} ms after its deadline ({} ms of a {} ms budget)",
                fmt_ms(duration - received),
                fmt_ms(duration),
                fmt_ms(received)
            ),
        );
    }
    let deadline = tree.start_ms[h] + received;
    let passed_during_hop = tree.end_ms[h] > deadline + tau;
    let waiting_downstream = facts.owned_calls[h].iter().any(|&c| {
        facts.has_child_hop(c) && tree.start_ms[c] <= deadline && deadline <= tree.end_ms[c]
    });
    let doomed_call = facts.owned_calls[h]
        .iter()
        .copied()
        .find(|&c| drafts[c].flags.iter().any(|f| f.flag == Flag::Doomed));
    let local = if passed_during_hop && !waiting_downstream {
        Some("deadline passed during its own work".to_string())
    } else {
        doomed_call.map(|c| {
            format!(
                "called {} after its deadline had passed",
                facts.target_label(c)
            )
        })
    };
    if let Some(message) = local {
        drafts[h].exceed = Some(Exceed::Local);
        drafts[h].flag(Flag::LocalExceed, message);
    }
    if is_deadline_class(&facts.spans[h])
        && facts.owned_calls[h].is_empty()
        && duration < received / 2.0
    {
        drafts[h].flag(
            Flag::Refused,
            "declined work it could not finish (good)".into(),
        );
    }
}

/// Duration minus the union of the hop's calls that reached an instrumented hop.
fn self_ms(facts: &Facts, h: usize) -> f64 {
    let tree = facts.tree;
    let (start, end) = (tree.start_ms[h], tree.end_ms[h]);
    let mut waiting = 0.0;
    let mut covered_to = start;
    // owned_calls is sorted by start, so one sweep merges the intervals.
    for &c in &facts.owned_calls[h] {
        if !facts.has_child_hop(c) {
            continue;
        }
        let (from, to) = (tree.start_ms[c].max(covered_to), tree.end_ms[c].min(end));
        if to > from {
            waiting += to - from;
            covered_to = to;
        }
    }
    (facts.duration[h] - waiting).max(0.0)
}

/// `retry` and `unsafe_retry`: repeated calls of one owner to one target, and call spans
/// that hold several attempts (several child hops).
fn retries(facts: &Facts, drafts: &mut [Draft]) {
    let tree = facts.tree;
    let mut groups: HashMap<(usize, String), Vec<usize>> = HashMap::new();
    for &c in &tree.order {
        if tree.role[c] != Role::Call {
            continue;
        }
        let owner = tree.owner[c].or(tree.parent[c]).unwrap_or(usize::MAX);
        groups
            .entry((owner, facts.retry_target(c)))
            .or_default()
            .push(c);
    }
    for calls in groups.values() {
        // Calls of the group by end time: those that ended before a call started are its
        // earlier attempts (they necessarily started before it too). O(n log n).
        let mut by_end: Vec<usize> = calls.clone();
        by_end.sort_by(|a, b| tree.end_ms[*a].total_cmp(&tree.end_ms[*b]));
        let total = calls.len();
        for &c in calls {
            let ended_before = by_end.partition_point(|&e| tree.end_ms[e] <= tree.start_ms[c]);
            // A zero-length call "ends before it starts": it is not its own earlier attempt.
            let earlier = by_end[..ended_before].iter().filter(|&&e| e != c).count();
            let attempt = earlier as u32 + 1;
            drafts[c].attempt = Some(attempt);
            if attempt == 1 {
                continue;
            }
            drafts[c].flag(Flag::Retry, format!("attempt {attempt} of {total}"));
            let previous = by_end[..ended_before]
                .iter()
                .rev()
                .copied()
                .find(|&e| e != c);
            if let (Some(method), Some(previous)) = (is_unsafe_method(&facts.spans[c]), previous)
                && outcome_unknown(&facts.spans[previous])
            {
                drafts[c].flag(
                    Flag::UnsafeRetry,
                    format!("{method} retried without an idempotency key after an attempt with no known outcome: may have charged twice"),
                );
            }
        }
    }
    for &c in &tree.order {
        if tree.role[c] != Role::Call {
            continue;
        }
        let attempts: Vec<usize> = tree.child_hops(c).collect();
        if attempts.len() < 2 {
            continue;
        }
        for (k, &h) in attempts.iter().enumerate() {
            drafts[h].attempt = Some(k as u32 + 1);
        }
        drafts[c].flag(
            Flag::Retry,
            format!("{} attempts in one call span", attempts.len()),
        );
        let unknown_before_last = attempts[..attempts.len() - 1]
            .iter()
            .any(|&h| outcome_unknown(&facts.spans[h]));
        if let Some(method) = is_unsafe_method(&facts.spans[c])
            && unknown_before_last
            && !drafts[c].flags.iter().any(|f| f.flag == Flag::UnsafeRetry)
        {
            drafts[c].flag(
                Flag::UnsafeRetry,
                format!("{method} retried without an idempotency key after an attempt with no known outcome: may have charged twice"),
            );
        }
    }
}

/// The edge hop, the request budget, burns, the burner, the outcome, counts and rows.
fn summarise(facts: &Facts, drafts: Vec<Draft>, options: &AnalyzeOptions) -> Analysis {
    let (spans, tree) = (facts.spans, facts.tree);
    let position: HashMap<usize, usize> = tree
        .order
        .iter()
        .enumerate()
        .map(|(row, &i)| (i, row))
        .collect();
    let edge = tree
        .order
        .iter()
        .copied()
        .filter(|&i| tree.role[i] == Role::Hop && facts.budget[i].is_some())
        .min_by_key(|&i| (tree.depth[i], position[&i]));
    let request_budget = edge.and_then(|e| facts.budget[e]);

    let mut rows: Vec<Row> = Vec::with_capacity(spans.len());
    let mut drafts: Vec<Option<Draft>> = drafts.into_iter().map(Some).collect();
    for &i in &tree.order {
        // The walk puts every span in the order exactly once.
        let Some(draft) = drafts[i].take() else {
            continue;
        };
        let burn = match (draft.self_ms, request_budget) {
            (Some(own), Some(budget)) if budget > 0.0 => Some(own / budget),
            _ => None,
        };
        let deadline_offset_ms = facts.deadline[i].or_else(|| facts.owner_deadline(i));
        rows.push(Row {
            span: i,
            depth: tree.depth[i],
            role: tree.role[i],
            owner: tree.owner[i],
            start_offset_ms: tree.start_ms[i],
            duration_ms: facts.duration[i],
            budget_ms: facts.budget[i],
            available_ms: draft.available_ms,
            deadline_offset_ms,
            self_ms: draft.self_ms,
            burn,
            exceed: draft.exceed,
            attempt: draft.attempt,
            wasted_ms: draft.wasted_ms,
            skew_shift_ms: 0.0,
            critical_ms: None,
            flags: draft.flags,
            warnings: tree.warnings[i].clone(),
        });
    }

    let burner = rows
        .iter()
        .enumerate()
        .filter_map(|(r, row)| row.self_ms.map(|own| (r, own)))
        .fold(None, |best: Option<(usize, f64)>, (r, own)| match best {
            Some((_, top)) if top >= own => best,
            _ => Some((r, own)),
        })
        .map(|(r, _)| r);
    let edge_row = edge.map(|e| position[&e]);
    let outcome = match edge_row {
        None => Outcome::NoBudget,
        Some(r) => {
            let overspent = rows[r].flags.iter().any(|f| f.flag == Flag::Overspent);
            if overspent || is_deadline_class(&spans[rows[r].span]) {
                Outcome::Exceeded
            } else {
                Outcome::Ok
            }
        }
    };
    // An exceeded request that still has no origin is counted at its edge hop.
    let has_origin = rows.iter().any(|row| {
        row.exceed == Some(Exceed::Local) || row.flags.iter().any(|f| f.flag == Flag::Refused)
    });
    if outcome == Outcome::Exceeded
        && !has_origin
        && let Some(r) = edge_row
        && rows[r].exceed.is_none()
    {
        rows[r].exceed = Some(Exceed::Local);
        rows[r].flags.push(FlagNote {
            flag: Flag::LocalExceed,
            message: "unattributed: the request exceeded its budget, and no hop's own work, call or cancellation explains where".into(),
        });
    }
    let origins = if outcome == Outcome::Exceeded {
        (0..rows.len())
            .filter(|&r| {
                rows[r].exceed == Some(Exceed::Local)
                    || rows[r].flags.iter().any(|f| f.flag == Flag::Refused)
            })
            .collect()
    } else {
        Vec::new()
    };
    let mut flag_counts = BTreeMap::new();
    for note in rows.iter().flat_map(|row| &row.flags) {
        *flag_counts.entry(note.flag).or_insert(0) += 1;
    }
    let mut calls_reaching = BTreeMap::new();
    for row in rows.iter().filter(|row| row.role == Role::Hop) {
        *calls_reaching
            .entry(spans[row.span].service.clone())
            .or_insert(0) += 1;
    }
    let duration_ms = tree.end_ms.iter().copied().fold(0.0, f64::max);
    Analysis {
        outcome,
        budget_ms: request_budget,
        duration_ms,
        tolerance_ms: options.tolerance_ms,
        burner,
        edge: edge_row,
        origins,
        flag_counts,
        calls_reaching,
        critical_path: Vec::new(),
        critical_hop: None,
        rows,
    }
}
