//! The shape of a trace: parents, children, waterfall order, depth, roles and owner hops.
//! Odd links (missing parent, duplicate span id, a cycle) become warnings and roots.

use std::collections::HashMap;

use super::Role;
use crate::core::model::{Span, SpanId, SpanKind};

pub(super) struct Tree {
    pub parent: Vec<Option<usize>>,
    /// The span names a parent that is not in the trace (it is shown as a root).
    pub missing_parent: Vec<bool>,
    pub children: Vec<Vec<usize>>,
    /// Depth-first, children by start time, roots by start time.
    pub order: Vec<usize>,
    pub depth: Vec<usize>,
    pub role: Vec<Role>,
    /// The nearest ancestor-or-self that is a hop of the same service.
    pub owner: Vec<Option<usize>>,
    /// Times in ms relative to the earliest start (raw, no skew shift).
    pub start_ms: Vec<f64>,
    pub end_ms: Vec<f64>,
    pub warnings: Vec<Vec<String>>,
}

pub(super) fn role(span: &Span) -> Role {
    match span.kind {
        kind if Role::HOP_KINDS.contains(&kind) => Role::Hop,
        SpanKind::Client | SpanKind::Producer => Role::Call,
        SpanKind::Internal | SpanKind::Unspecified if span.budget.is_some() => Role::Checkpoint,
        _ => Role::Other,
    }
}

impl Tree {
    pub fn build(spans: &[Span]) -> Tree {
        let n = spans.len();
        let t0 = spans.iter().map(|s| s.start_unix_nano).min().unwrap_or(0);
        let offset = |t: u64| t.saturating_sub(t0) as f64 / 1e6;
        let start_ms: Vec<f64> = spans.iter().map(|s| offset(s.start_unix_nano)).collect();
        let end_ms: Vec<f64> = spans
            .iter()
            .map(|s| offset(s.end_unix_nano.max(s.start_unix_nano)))
            .collect();
        let mut warnings: Vec<Vec<String>> = spans.iter().map(|s| s.warnings.clone()).collect();
        for (i, span) in spans.iter().enumerate() {
            if span.end_unix_nano < span.start_unix_nano {
                warnings[i].push("ends before it starts; shown with zero duration".into());
            }
        }

        // The first copy of a duplicated id is the one children link to.
        let mut index: HashMap<SpanId, usize> = HashMap::with_capacity(n);
        for (i, span) in spans.iter().enumerate() {
            if let std::collections::hash_map::Entry::Vacant(slot) = index.entry(span.span_id) {
                slot.insert(i);
            } else {
                warnings[i].push("another span has the same id; children link to the first".into());
            }
        }

        let mut parent = vec![None; n];
        let mut missing_parent = vec![false; n];
        for (i, span) in spans.iter().enumerate() {
            if let Some(parent_id) = span.parent_span_id {
                match index.get(&parent_id) {
                    Some(&p) if p != i => parent[i] = Some(p),
                    _ => missing_parent[i] = true,
                }
            }
        }
        let by_start = |a: &usize, b: &usize| {
            (spans[*a].start_unix_nano, spans[*a].span_id, *a).cmp(&(
                spans[*b].start_unix_nano,
                spans[*b].span_id,
                *b,
            ))
        };
        let mut children: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, p) in parent.iter().enumerate() {
            if let Some(p) = p {
                children[*p].push(i);
            }
        }
        for list in &mut children {
            list.sort_by(by_start);
        }
        let role: Vec<Role> = spans.iter().map(role).collect();

        let mut tree = Tree {
            parent,
            missing_parent,
            children,
            order: Vec::with_capacity(n),
            depth: vec![0; n],
            role,
            owner: vec![None; n],
            start_ms,
            end_ms,
            warnings,
        };
        let mut roots: Vec<usize> = (0..n).filter(|i| tree.parent[*i].is_none()).collect();
        roots.sort_by(by_start);
        let mut visited = vec![false; n];
        for root in roots {
            tree.walk(spans, root, &mut visited);
        }
        // Whatever is left hangs off a cycle of parent links: break it at its earliest span.
        let mut rest: Vec<usize> = (0..n).filter(|i| !visited[*i]).collect();
        rest.sort_by(by_start);
        for i in rest {
            if !visited[i] {
                tree.warnings[i].push("its parent links form a cycle; shown as a root".into());
                tree.parent[i] = None;
                tree.walk(spans, i, &mut visited);
            }
        }
        tree
    }

    /// Iterative depth-first walk (traces can be deeper than the stack), assigning order,
    /// depth and owner hops. A stack of hops per service gives each span its owner in O(1).
    fn walk(&mut self, spans: &[Span], root: usize, visited: &mut [bool]) {
        let mut hops_by_service: HashMap<&str, Vec<usize>> = HashMap::new();
        // (span, depth, entering?)
        let mut stack = vec![(root, 0usize, true)];
        while let Some((i, depth, entering)) = stack.pop() {
            let service = spans[i].service.as_str();
            if !entering {
                if self.role[i] == Role::Hop
                    && let Some(hops) = hops_by_service.get_mut(service)
                {
                    hops.pop();
                }
                continue;
            }
            if visited[i] {
                continue;
            }
            visited[i] = true;
            self.order.push(i);
            self.depth[i] = depth;
            if self.role[i] == Role::Hop {
                hops_by_service.entry(service).or_default().push(i);
            }
            self.owner[i] = hops_by_service
                .get(service)
                .and_then(|hops| hops.last().copied());
            stack.push((i, depth, false));
            for &child in self.children[i].iter().rev() {
                if !visited[child] {
                    stack.push((child, depth + 1, true));
                }
            }
        }
    }

    pub fn duration_ms(&self, i: usize) -> f64 {
        self.end_ms[i] - self.start_ms[i]
    }

    /// Child spans of `i` that are hops.
    pub fn child_hops(&self, i: usize) -> impl Iterator<Item = usize> + '_ {
        self.children[i]
            .iter()
            .copied()
            .filter(|c| self.role[*c] == Role::Hop)
    }
}
