//! Display adjustment for clock skew between hosts, as Jaeger's adjuster does: a child hop
//! of another service that starts outside the call that reached it is centred in that call
//! (or aligned to its start when longer), and its whole subtree moves with it. A hop that
//! starts inside its call is never moved, even when it ends after it: that is work done
//! after the caller gave up (docs/budget-semantics.md,
//! "Reading the waterfall").
//!
//! Architecture invariant: runs after every flag is decided and only moves display offsets
//! (`start_offset_ms`, `deadline_offset_ms`, recording `skew_shift_ms`); no rule reads them.

use super::tree::Tree;
use super::{Analysis, Role};
use crate::core::model::Span;

pub(super) fn adjust(spans: &[Span], tree: &Tree, analysis: &mut Analysis) {
    let mut shift = vec![0.0f64; spans.len()];
    for &i in &tree.order {
        let inherited = tree.parent[i].map_or(0.0, |p| shift[p]);
        shift[i] = inherited;
        let Some(p) = tree.parent[i] else { continue };
        if tree.role[p] != Role::Call
            || tree.role[i] != Role::Hop
            || spans[p].service == spans[i].service
        {
            continue;
        }
        let (call_start, call_end) = (tree.start_ms[p] + shift[p], tree.end_ms[p] + shift[p]);
        let (hop_start, hop_end) = (tree.start_ms[i] + inherited, tree.end_ms[i] + inherited);
        // A hop that starts inside its call is where it happened: one that ends after its
        // call kept working after its caller gave up (`wasted`), not a skewed clock.
        if hop_start >= call_start && hop_start <= call_end {
            continue;
        }
        let (call_duration, hop_duration) = (call_end - call_start, hop_end - hop_start);
        let target = if hop_duration <= call_duration {
            call_start + (call_duration - hop_duration) / 2.0
        } else {
            call_start
        };
        shift[i] = inherited + (target - hop_start);
    }
    // The shown timeline starts at the earliest shifted start.
    let origin = tree
        .order
        .iter()
        .map(|&i| tree.start_ms[i] + shift[i])
        .fold(f64::INFINITY, f64::min);
    let origin = if origin.is_finite() { origin } else { 0.0 };
    for row in &mut analysis.rows {
        let i = row.span;
        row.skew_shift_ms = shift[i];
        row.start_offset_ms += shift[i] - origin;
        let deadline_owner = if row.role == Role::Hop {
            Some(i)
        } else {
            tree.owner[i]
        };
        if let (Some(deadline), Some(owner)) = (row.deadline_offset_ms.as_mut(), deadline_owner) {
            *deadline += shift[owner] - origin;
        }
    }
}
