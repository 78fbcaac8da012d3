//! `/map`: the service map of budget flows, drawn server-side as SVG with a small layered
//! layout (callers left of callees; cycles broken; each layer ordered by its neighbours'
//! positions), and the same numbers as tables. Colour and line style encode health, each
//! with words beside it; hovering shows the numbers (SVG titles); a node opens its hop page
//! (or, grouped by service, that service's map by operation), an edge its traces.

use std::collections::BTreeMap;

use askama::Template;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;

use super::{
    PageError, RangeLink, TimeRange, fmt_duration, fmt_opt_duration, hop_href, html, query_string,
};
use crate::core::advice::{HopId, Subject};
use crate::web::AppState;
use crate::web::map::{Group, Health, ServiceMap, of_rows, rows};

const NODE_W: i64 = 200;
const NODE_H: i64 = 56;
const GAP_X: i64 = 150;
const GAP_Y: i64 = 40;
const MARGIN: i64 = 20;
/// The height an edge passing through a layer takes there.
const LANE: i64 = 16;

pub struct NodeView {
    pub x: i64,
    pub y: i64,
    pub service: String,
    pub operation: String,
    pub health: &'static str,
    pub instrumented: bool,
    pub label: String,
    pub href: String,
    pub title: String,
    /// The kinds of the advisor's findings on the hops of this node, and where the advisor
    /// shows them.
    pub advice: Vec<&'static str>,
    pub advice_href: String,
}

pub struct EdgeView {
    pub path: String,
    pub label_x: i64,
    pub label_y: i64,
    pub health: &'static str,
    pub rate: String,
    pub label: String,
    /// The label as the picture shows it: "50 % clamped".
    pub short: String,
    pub href: String,
    pub title: String,
    pub caller: String,
    pub callee: String,
    pub calls: i64,
    pub attempts: String,
    pub forwarded: String,
    pub latency: String,
    /// The kinds of the advisor's findings on this edge, and where the advisor shows them.
    pub advice: Vec<&'static str>,
    pub advice_href: String,
}

#[derive(Template)]
#[template(path = "map.html")]
pub struct MapPage {
    pub nav: &'static str,
    pub range: TimeRange,
    pub range_links: Vec<RangeLink>,
    pub range_keep: Vec<(String, String)>,
    pub range_description: String,
    pub group: &'static str,
    pub service: String,
    pub width: i64,
    pub height: i64,
    pub nodes: Vec<NodeView>,
    pub edges: Vec<EdgeView>,
    pub other_group_href: String,
    pub other_group_label: &'static str,
}

pub async fn map(
    State(state): State<AppState>,
    Query(params): Query<BTreeMap<String, String>>,
) -> Result<Response, PageError> {
    let range = TimeRange::from_query(&params)?;
    let group = Group::parse(params.get("group").map_or("", String::as_str)).ok_or_else(|| {
        PageError::bad_request("Unknown grouping: use group=service or group=operation.")
    })?;
    let service = params
        .get("service")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let (since, until) = range.aligned();
    let only = Some(service.as_str()).filter(|s| !s.is_empty());
    // One read serves the picture and the advisor's marks.
    let rows = rows(state.store.as_ref(), since, until, only).await?;
    let advice: Vec<(Subject, &'static str)> =
        crate::web::advisor::of_rows(&rows, state.analyze.tolerance_ms)
            .into_iter()
            .map(|finding| (finding.subject, finding.kind))
            .collect();
    let map = of_rows(rows, since, until, group, only);
    Ok(html(StatusCode::OK, &page(&map, &range, &service, &advice)))
}

/// Whether a node of the map is, or holds, the hop identity `id`.
fn holds(node: &crate::web::map::Node, id: &HopId) -> bool {
    node.service == id.0
        && match &node.operation {
            Some(operation) => *operation == id.1,
            // A service's node holds its every hop; a peer's, the calls to that peer.
            None if node.instrumented => true,
            None => id.1.is_empty(),
        }
}

/// The kinds of the findings `about` keeps, sorted, once each.
fn kinds_of(
    advice: &[(Subject, &'static str)],
    about: impl Fn(&Subject) -> bool,
) -> Vec<&'static str> {
    let mut kinds: Vec<&'static str> = advice
        .iter()
        .filter(|(subject, _)| about(subject))
        .map(|(_, kind)| *kind)
        .collect();
    kinds.sort_unstable();
    kinds.dedup();
    kinds
}

/// The advisor's page for one service.
fn advisor_href(range: &TimeRange, service: &str) -> String {
    let mut pairs = range.pairs();
    pairs.push(("service", service));
    format!("/advisor{}", query_string(pairs))
}

/// The page for a map and the advisor's findings (what each is about, its kind): pure, so
/// tests can call it.
pub fn page(
    map: &ServiceMap,
    range: &TimeRange,
    service: &str,
    advice: &[(Subject, &'static str)],
) -> MapPage {
    let placed = layout(
        map.nodes.len(),
        &map.edges
            .iter()
            .map(|e| (e.caller, e.callee))
            .collect::<Vec<_>>(),
    );
    // Each layer's rows top to bottom: a node takes a box's height, an edge passing
    // through a narrow lane, so bundles of long edges stay compact.
    let mut height_of: BTreeMap<(usize, usize), i64> = BTreeMap::new();
    for &slot in placed.routes.iter().flatten() {
        height_of.insert(slot, LANE);
    }
    for &slot in &placed.nodes {
        height_of.insert(slot, NODE_H + GAP_Y);
    }
    let mut top: BTreeMap<(usize, usize), i64> = BTreeMap::new();
    let mut bottom = 0;
    let mut layers = 0;
    let mut layer_end: BTreeMap<usize, i64> = BTreeMap::new();
    for (&(layer, row), &h) in &height_of {
        let y = *layer_end.get(&layer).unwrap_or(&MARGIN);
        top.insert((layer, row), y);
        layer_end.insert(layer, y + h);
        bottom = bottom.max(y + h);
        layers = layers.max(layer as i64 + 1);
    }
    let xy = |slot: (usize, usize)| {
        (
            MARGIN + slot.0 as i64 * (NODE_W + GAP_X),
            top.get(&slot).copied().unwrap_or(MARGIN),
        )
    };
    let at = |i: usize| xy(placed.nodes[i]);
    let range_query = range.query();
    let keep = |group: Group| {
        let mut pairs = range.pairs();
        pairs.push(("group", group.as_str()));
        pairs.push(("service", service));
        format!("/map{}", query_string(pairs))
    };
    let nodes = map
        .nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            let (x, y) = at(i);
            let operation = node.operation.clone().unwrap_or_default();
            let href = match (&node.operation, node.instrumented) {
                (Some(op), true) => hop_href(&node.service, op, &range_query),
                (None, true) => {
                    let mut pairs = range.pairs();
                    pairs.push(("group", "operation"));
                    pairs.push(("service", &node.service));
                    format!("/map{}", query_string(pairs))
                }
                (_, false) => range.search_href(&[]),
            };
            NodeView {
                advice: kinds_of(advice, |subject| {
                    subject.hop().is_some_and(|hop| holds(node, hop))
                }),
                advice_href: advisor_href(range, &node.service),
                x,
                y,
                title: format!("{} {}: {}", node.service, operation, node.label),
                service: fit(&node.service),
                operation: fit(&operation),
                health: node.health.as_str(),
                instrumented: node.instrumented,
                label: node.label.clone(),
                href,
            }
        })
        .collect();
    let edges = map
        .edges
        .iter()
        .enumerate()
        .filter(|(_, e)| e.caller != e.callee)
        .map(|(i, edge)| {
            let (path, label_x, label_y) = route(
                at(edge.caller),
                at(edge.callee),
                placed.nodes[edge.callee].0 > placed.nodes[edge.caller].0,
                placed.routes[i].iter().map(|&slot| xy(slot)),
            );
            let (caller, callee) = (&map.nodes[edge.caller], &map.nodes[edge.callee]);
            let name = |n: &crate::web::map::Node| match &n.operation {
                Some(op) => format!("{} {op}", n.service),
                None => n.service.clone(),
            };
            let r = &edge.rollup;
            let forwarded = match (r.forwarded.quantile(0.5), r.forwarded.quantile(0.99)) {
                (Some(p50), Some(p99)) => format!("{} / {}", fmt_duration(p50), fmt_duration(p99)),
                _ => "none".into(),
            };
            let latency = fmt_opt_duration(r.latency.quantile(0.99));
            let attempts = format!("{:.2}", r.calls as f64 / r.requests.max(1) as f64);
            let rate = if edge.calls_per_minute >= 0.1 {
                format!("{:.1}/min", edge.calls_per_minute)
            } else {
                format!("{} call{}", r.calls, if r.calls == 1 { "" } else { "s" })
            };
            let target = if callee.instrumented { callee } else { caller };
            let kinds = kinds_of(advice, |subject| {
                subject
                    .edge()
                    .is_some_and(|(from, to)| holds(caller, from) && holds(callee, to))
            });
            let view = EdgeView {
                path,
                label_x,
                label_y,
                health: edge.health.as_str(),
                title: format!(
                    "{} → {}: {rate}, budget forwarded p50/p99 {forwarded}, latency p99 \
                     {latency}, {attempts} attempts per request; {}",
                    name(caller),
                    name(callee),
                    edge.label
                ),
                href: range.search_href(&[
                    ("service", target.service.as_str()),
                    ("operation", target.operation.as_deref().unwrap_or("")),
                ]),
                rate,
                short: edge.label.replace(" of calls", ""),
                label: edge.label.clone(),
                caller: name(caller),
                callee: name(callee),
                calls: r.calls,
                attempts,
                forwarded,
                latency,
                advice: kinds,
                advice_href: advisor_href(range, &caller.service),
            };
            (edge.health, view)
        })
        .collect();
    let mut edges: Vec<(Health, EdgeView)> = edges;
    edges.sort_by(|a, b| a.0.rank().cmp(&b.0.rank()).then(b.1.calls.cmp(&a.1.calls)));
    let edges: Vec<EdgeView> = edges.into_iter().map(|(_, e)| e).collect();
    let (other, other_label) = match map.group {
        Group::Service => (Group::Operation, "Show operations"),
        Group::Operation => (Group::Service, "Group by service"),
    };
    let mut links_extra = vec![("group", map.group.as_str())];
    if !service.is_empty() {
        links_extra.push(("service", service));
    }
    MapPage {
        nav: "map",
        range_links: range.links("/map", &links_extra),
        range_keep: links_extra
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        range_description: range.description(),
        range: range.clone(),
        group: map.group.as_str(),
        service: service.to_string(),
        width: (2 * MARGIN + layers * (NODE_W + GAP_X) - GAP_X).max(NODE_W),
        height: bottom + MARGIN - GAP_Y,
        nodes,
        edges,
        other_group_href: keep(other),
        other_group_label: other_label,
    }
}

/// An edge's path from the caller's box to the callee's through the lanes of its route
/// (top-left corners, caller side first), and where its label goes: on the first stretch.
/// Edges to the right leave a box's right side two fifths down, edges to the left (closing
/// a cycle) its left side seven tenths down, so a pair of opposite edges never overlaps.
fn route(
    from: (i64, i64),
    to: (i64, i64),
    rightward: bool,
    slots: impl Iterator<Item = (i64, i64)>,
) -> (String, i64, i64) {
    let (near, far, dy) = if rightward {
        (NODE_W, 0, NODE_H * 2 / 5)
    } else {
        (0, NODE_W, NODE_H * 7 / 10)
    };
    // Pairs of (enter, leave) points: the caller's leaving side, each slot, the callee.
    let mut stops = vec![((from.0 + near, from.1 + dy), (from.0 + near, from.1 + dy))];
    for (x, y) in slots {
        stops.push(((x + far, y + LANE / 2), (x + near, y + LANE / 2)));
    }
    stops.push(((to.0 + far, to.1 + dy), (to.0 + far, to.1 + dy)));
    let mut path = format!("M{} {}", stops[0].1.0, stops[0].1.1);
    for pair in stops.windows(2) {
        let ((_, (ax, ay)), ((bx, by), leave)) = (pair[0], pair[1]);
        let bend = (bx - ax) / 2;
        path.push_str(&format!(
            " C{} {ay} {} {by} {bx} {by}",
            ax + bend,
            bx - bend
        ));
        if leave != (bx, by) {
            path.push_str(&format!(" L{} {}", leave.0, leave.1));
        }
    }
    let ((_, (ax, ay)), ((bx, by), _)) = (stops[0], stops[1]);
    (path, (ax + bx) / 2, (ay + by) / 2 - 4)
}

/// A name cut to what a node's box shows; the full name is in its title.
fn fit(text: &str) -> String {
    const MOST: usize = 27;
    if text.chars().count() <= MOST {
        text.to_string()
    } else {
        let cut: String = text.chars().take(MOST - 1).collect();
        format!("{cut}…")
    }
}

impl Health {
    /// Ranked for the tables: the worst first.
    fn rank(self) -> u8 {
        match self {
            Health::Bad => 0,
            Health::Warn => 1,
            Health::Ok => 2,
        }
    }
}

/// Where the layout puts nodes and routes edges.
pub struct Layout {
    /// (layer, row) of each node.
    pub nodes: Vec<(usize, usize)>,
    /// Per edge, the (layer, row) slots it passes through between its ends, caller side
    /// first: edges never cross a node.
    pub routes: Vec<Vec<(usize, usize)>>,
}

/// A layered layout: callers in layers left of their callees (longest path from the nodes
/// nobody calls; an edge closing a cycle is laid out reversed), an edge spanning several
/// layers passing through a slot in each, each layer ordered by the mean row of its
/// neighbours, sweeping a few times.
pub fn layout(n: usize, edges: &[(usize, usize)]) -> Layout {
    let mut out: Vec<Vec<usize>> = vec![Vec::new(); n];
    for &(a, b) in edges.iter().filter(|(a, b)| a != b) {
        out[a].push(b);
    }
    // Depth-first from every node in order: an edge to a node still on the stack closes a
    // cycle and is laid out reversed.
    let mut state = vec![0u8; n]; // 0 new, 1 on the stack, 2 done
    let mut closes_cycle: std::collections::HashSet<(usize, usize)> = Default::default();
    for root in 0..n {
        if state[root] != 0 {
            continue;
        }
        let mut stack = vec![(root, 0usize)];
        state[root] = 1;
        while let Some((v, next)) = stack.pop() {
            if next < out[v].len() {
                stack.push((v, next + 1));
                let w = out[v][next];
                match state[w] {
                    0 => {
                        state[w] = 1;
                        stack.push((w, 0));
                    }
                    1 => {
                        closes_cycle.insert((v, w));
                    }
                    _ => {}
                }
            } else {
                state[v] = 2;
            }
        }
    }
    // Each edge as laid out: from the left end to the right end.
    let directed: Vec<Option<(usize, usize)>> = edges
        .iter()
        .map(|&(a, b)| {
            (a != b).then(|| {
                if closes_cycle.contains(&(a, b)) {
                    (b, a)
                } else {
                    (a, b)
                }
            })
        })
        .collect();
    // Longest path, in a topological order.
    let mut indegree = vec![0usize; n];
    let mut next: Vec<Vec<usize>> = vec![Vec::new(); n];
    for &(a, b) in directed.iter().flatten() {
        indegree[b] += 1;
        next[a].push(b);
    }
    let mut layer = vec![0usize; n];
    let mut ready: Vec<usize> = (0..n).filter(|&v| indegree[v] == 0).collect();
    while let Some(v) = ready.pop() {
        for &w in &next[v] {
            layer[w] = layer[w].max(layer[v] + 1);
            indegree[w] -= 1;
            if indegree[w] == 0 {
                ready.push(w);
            }
        }
    }
    // Slots: the nodes, then one per layer crossed by a long edge.
    let mut slot_layer = layer.clone();
    let mut chains: Vec<Vec<usize>> = Vec::with_capacity(edges.len());
    let mut links: Vec<(usize, usize)> = Vec::new();
    for d in &directed {
        let mut chain = Vec::new();
        if let Some((a, b)) = *d {
            let mut previous = a;
            for l in layer[a] + 1..layer[b] {
                slot_layer.push(l);
                let slot = slot_layer.len() - 1;
                links.push((previous, slot));
                chain.push(slot);
                previous = slot;
            }
            links.push((previous, b));
        }
        chains.push(chain);
    }
    let slots = slot_layer.len();
    let layers = slot_layer.iter().max().map_or(0, |m| m + 1);
    let mut order: Vec<Vec<usize>> = vec![Vec::new(); layers];
    for v in 0..slots {
        order[slot_layer[v]].push(v);
    }
    let mut neighbours: Vec<Vec<usize>> = vec![Vec::new(); slots];
    for &(a, b) in &links {
        neighbours[a].push(b);
        neighbours[b].push(a);
    }
    let mut row = vec![0usize; slots];
    for nodes in &order {
        for (i, &v) in nodes.iter().enumerate() {
            row[v] = i;
        }
    }
    for _ in 0..4 {
        for nodes in order.iter_mut() {
            let key = |v: usize| {
                let near = &neighbours[v];
                if near.is_empty() {
                    row[v] as f64
                } else {
                    near.iter().map(|&u| row[u] as f64).sum::<f64>() / near.len() as f64
                }
            };
            let mut keyed: Vec<(f64, usize)> = nodes.iter().map(|&v| (key(v), v)).collect();
            keyed.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            *nodes = keyed.into_iter().map(|(_, v)| v).collect();
            for (i, &v) in nodes.iter().enumerate() {
                row[v] = i;
            }
        }
    }
    let place = |v: usize| (slot_layer[v], row[v]);
    Layout {
        nodes: (0..n).map(place).collect(),
        routes: chains
            .iter()
            .zip(&directed)
            .zip(edges)
            .map(|((chain, d), &(a, _))| {
                let mut route: Vec<(usize, usize)> = chain.iter().map(|&v| place(v)).collect();
                // Laid out reversed: the caller is at the right end.
                if d.is_some_and(|(left, _)| left != a) {
                    route.reverse();
                }
                route
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::layout;

    #[test]
    fn callers_sit_left_of_their_callees_and_long_edges_pass_through_slots() {
        // 0 → 1 → 2, 0 → 2 (long), 0 → 3, 2 → 1 (closes a cycle), 4 alone, 5 → 5.
        let edges = [(0, 1), (1, 2), (0, 2), (0, 3), (2, 1), (5, 5)];
        let placed = layout(6, &edges);
        let layer = |v: usize| placed.nodes[v].0;
        assert_eq!((layer(0), layer(1), layer(2), layer(3)), (0, 1, 2, 1));
        assert_eq!(placed.routes[2].len(), 1, "0 → 2 passes through layer 1");
        assert_eq!(placed.routes[2][0].0, 1);
        assert!(
            placed.routes[4].is_empty(),
            "2 → 1 is drawn between adjacent layers"
        );
        assert!(placed.routes[5].is_empty(), "a call to itself has no route");
        // No two slots share a place.
        let mut seen: Vec<(usize, usize)> = placed.nodes.clone();
        seen.extend(placed.routes.iter().flatten());
        let count = seen.len();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), count);
    }

    #[test]
    fn two_hundred_nodes_lay_out_in_their_layers() {
        let edges: Vec<(usize, usize)> = (1..200).map(|i| ((i - 1) / 3, i)).collect();
        let placed = layout(200, &edges);
        for &(a, b) in &edges {
            assert!(placed.nodes[a].0 < placed.nodes[b].0);
        }
    }
}
