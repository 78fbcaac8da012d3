//! The service map of budget flows: `GET /api/map` and the model the `/map` page draws.
//! Nodes are hop identities (or their services, `group=service`) and the peers of calls
//! that reached no instrumented hop; edges are the call-edge rollups of the range
//! (docs/budget-semantics.md, "Edges"), each with its health and the words that say it.

use std::collections::{BTreeMap, BTreeSet};

use axum::Json;
use axum::extract::{Query, State};
use serde_json::{Value, json};

use super::AppState;
use super::error::{ApiError, check_params};
use crate::core::analyze::edges::{EDGE_COUNTED, EdgeKey, EdgeRollup};
use crate::core::analyze::hops::{HopRollupRow, Rollup};
use crate::store::query::RollupQuery;
use crate::store::{Store, StoreError};

/// A problem on this share of an edge's calls, or a node's requests, makes it `bad`.
const BAD_SHARE: f64 = 0.05;
/// Retries on more than this share of an edge's calls make it `warn`.
const RETRY_SHARE: f64 = 0.10;

/// What a node or edge is drawn as: colour and line style, always with words too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Health {
    Ok,
    Warn,
    Bad,
}

impl Health {
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Ok => "ok",
            Health::Warn => "warn",
            Health::Bad => "bad",
        }
    }

    fn of_share(share: f64) -> Health {
        if share >= BAD_SHARE {
            Health::Bad
        } else if share > 0.0 {
            Health::Warn
        } else {
            Health::Ok
        }
    }
}

/// How nodes are drawn: one per hop identity, or one per service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    Operation,
    Service,
}

impl Group {
    pub fn parse(text: &str) -> Option<Group> {
        match text {
            "" | "service" => Some(Group::Service),
            "operation" => Some(Group::Operation),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Group::Operation => "operation",
            Group::Service => "service",
        }
    }
}

/// A node: a hop identity (or a service), or the peer of uninstrumented calls.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub service: String,
    /// None when grouped by service, or for an uninstrumented peer.
    pub operation: Option<String>,
    pub instrumented: bool,
    pub hops: Rollup,
    pub health: Health,
    /// "3 local exceeds of 120 requests", or for a peer "called 40 times".
    pub label: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Edge {
    /// Indexes into `ServiceMap::nodes`.
    pub caller: usize,
    pub callee: usize,
    pub rollup: EdgeRollup,
    pub calls_per_minute: f64,
    pub health: Health,
    /// The worst problem in words ("12 % of calls clamped"), or "healthy".
    pub label: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ServiceMap {
    pub group: Group,
    pub nodes: Vec<Node>,
    pub edges: Vec<Edge>,
}

type NodeKey = (String, Option<String>);

/// The rollups of `[since, until)` (minute-aligned) that the map and the advisor read: every
/// hop's, and the edges of every service or of one.
pub struct Rows {
    pub hops: Vec<HopRollupRow>,
    pub edges: Vec<(EdgeKey, EdgeRollup)>,
}

pub async fn rows(
    store: &dyn Store,
    since: u64,
    until: u64,
    service: Option<&str>,
) -> Result<Rows, StoreError> {
    let query = RollupQuery {
        since_unix_nano: since,
        until_unix_nano: until,
        hourly: true,
        ..Default::default()
    };
    Ok(Rows {
        edges: store
            .edge_rollups(&RollupQuery { service, ..query })
            .await?,
        hops: store.hop_rollups(&query).await?,
    })
}

/// The map of `[since, until)` from its rows.
pub fn of_rows(
    rows: Rows,
    since: u64,
    until: u64,
    group: Group,
    service: Option<&str>,
) -> ServiceMap {
    let minutes = ((until - since) as f64 / 60e9).max(1.0);
    build(rows.hops, rows.edges, group, service, minutes)
}

/// The map from rollup rows: pure, so tests and the page share it.
pub fn build(
    hop_rows: Vec<HopRollupRow>,
    edge_rows: Vec<(EdgeKey, EdgeRollup)>,
    group: Group,
    service: Option<&str>,
    minutes: f64,
) -> ServiceMap {
    let node_key = |service: &str, operation: &str| -> NodeKey {
        match group {
            Group::Service => (service.to_string(), None),
            Group::Operation => (service.to_string(), Some(operation.to_string())),
        }
    };
    let mut hops: BTreeMap<NodeKey, Rollup> = BTreeMap::new();
    for row in hop_rows {
        hops.entry(node_key(&row.service, &row.operation))
            .or_default()
            .merge(&row.rollup);
    }
    let mut edges: BTreeMap<(NodeKey, NodeKey), EdgeRollup> = BTreeMap::new();
    // Callees that are no instrumented hop: their peer name, no operation.
    let mut peers: BTreeSet<NodeKey> = BTreeSet::new();
    for ((caller_service, caller_operation, callee_service, callee_operation, _), rollup) in
        edge_rows
    {
        let caller = node_key(&caller_service, &caller_operation);
        let callee = if callee_operation.is_empty() {
            let peer = (callee_service, None);
            peers.insert(peer.clone());
            peer
        } else {
            node_key(&callee_service, &callee_operation)
        };
        edges.entry((caller, callee)).or_default().merge(&rollup);
    }
    // One service's map: its edges, and the nodes at their ends.
    let mut keys: BTreeSet<NodeKey> = edges
        .keys()
        .flat_map(|(a, b)| [a.clone(), b.clone()])
        .collect();
    match service {
        Some(service) => keys.extend(hops.keys().filter(|(s, _)| s == service).cloned()),
        None => keys.extend(hops.keys().cloned()),
    }
    let index: BTreeMap<&NodeKey, usize> = keys.iter().enumerate().map(|(i, k)| (k, i)).collect();
    let nodes = keys
        .iter()
        .map(|key| {
            let rollup = hops.get(key).cloned().unwrap_or_default();
            let instrumented = !peers.contains(key) || hops.contains_key(key);
            let (health, label) = if instrumented {
                node_health(&rollup)
            } else {
                let calls: i64 = edges
                    .iter()
                    .filter(|((_, callee), _)| callee == key)
                    .map(|(_, e)| e.calls)
                    .sum();
                (
                    Health::Ok,
                    format!("not instrumented; called {calls} times"),
                )
            };
            Node {
                service: key.0.clone(),
                operation: key.1.clone(),
                instrumented,
                hops: rollup,
                health,
                label,
            }
        })
        .collect();
    let edges = edges
        .into_iter()
        .map(|((caller, callee), rollup)| {
            let (health, label) = edge_health(&rollup);
            Edge {
                caller: index[&caller],
                callee: index[&callee],
                calls_per_minute: rollup.calls as f64 / minutes,
                rollup,
                health,
                label,
            }
        })
        .collect();
    ServiceMap {
        group,
        nodes,
        edges,
    }
}

fn percent(share: f64) -> String {
    let percent = share * 100.0;
    if percent >= 10.0 || percent == 0.0 {
        format!("{percent:.0} %")
    } else {
        format!("{percent:.1} %")
    }
}

/// A node's health: its requests that ran out of budget at it (local exceeds).
fn node_health(rollup: &Rollup) -> (Health, String) {
    let local = rollup.count("local_exceed");
    let inherited = rollup.count("inherited_exceed");
    let requests = rollup.requests.max(1);
    let health = Health::of_share(local as f64 / requests as f64);
    (
        health,
        format!(
            "{} req · {local} local · {inherited} inherited",
            rollup.requests
        ),
    )
}

/// An edge's health: the worst share of its calls with a budget problem, or retries past
/// `RETRY_SHARE`.
fn edge_health(rollup: &EdgeRollup) -> (Health, String) {
    let calls = rollup.calls.max(1) as f64;
    let worst = EDGE_COUNTED
        .iter()
        .filter(|name| **name != "retry")
        .map(|name| (*name, rollup.count(name) as f64 / calls))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .filter(|(_, share)| *share > 0.0);
    let retries = rollup.count("retry") as f64 / calls;
    match worst {
        Some((name, share)) => (
            Health::of_share(share),
            format!("{} of calls {}", percent(share), name.replace('_', " ")),
        ),
        None if retries > RETRY_SHARE => (
            Health::Warn,
            format!("{} of calls are retries", percent(retries)),
        ),
        None => (Health::Ok, "healthy".into()),
    }
}

fn node_json(node: &Node) -> Value {
    json!({
        "service": node.service,
        "operation": node.operation,
        "instrumented": node.instrumented,
        "requests": node.hops.requests,
        "local_exceed": node.hops.count("local_exceed"),
        "inherited_exceed": node.hops.count("inherited_exceed"),
        "origin": node.hops.count("origin"),
        "health": node.health.as_str(),
        "label": node.label,
    })
}

pub fn to_json(map: &ServiceMap) -> Value {
    let end = |i: usize| {
        let node = &map.nodes[i];
        json!({"service": node.service, "operation": node.operation})
    };
    let edges: Vec<Value> = map
        .edges
        .iter()
        .map(|edge| {
            let r = &edge.rollup;
            let per_call = |name: &str| r.count(name) as f64 / r.calls.max(1) as f64;
            let rates: serde_json::Map<String, Value> = EDGE_COUNTED
                .iter()
                .map(|name| ((*name).to_string(), json!(per_call(name))))
                .collect();
            json!({
                "caller": end(edge.caller),
                "callee": end(edge.callee),
                "calls": r.calls,
                "calls_per_minute": edge.calls_per_minute,
                "requests": r.requests,
                "attempts_per_request": r.calls as f64 / r.requests.max(1) as f64,
                "forwarded_ms": {"p50": r.forwarded.quantile(0.5), "p99": r.forwarded.quantile(0.99)},
                "left_ms": {"p50": r.left.quantile(0.5)},
                "latency_ms": {"p50": r.latency.quantile(0.5), "p99": r.latency.quantile(0.99)},
                "shortfall_ms": {"p50": r.shortfall.quantile(0.5), "p99": r.shortfall.quantile(0.99)},
                "rates": rates,
                "health": edge.health.as_str(),
                "label": edge.label,
            })
        })
        .collect();
    json!({
        "group": map.group.as_str(),
        "nodes": map.nodes.iter().map(node_json).collect::<Vec<_>>(),
        "edges": edges,
    })
}

/// `GET /api/map?since=&until=&service=&group=`.
pub async fn map(
    State(state): State<AppState>,
    Query(params): Query<BTreeMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    check_params(&params, &["since", "until", "service", "group"])?;
    let (since, until) = super::hops::time_range(&params, crate::clock::now_unix_nano())?;
    let group = Group::parse(params.get("group").map_or("", String::as_str)).ok_or_else(|| {
        ApiError::bad_request(
            "invalid_parameter",
            "parameter group: use service (one node per service) or operation (per hop)",
        )
    })?;
    let service = params
        .get("service")
        .map(String::as_str)
        .filter(|s| !s.is_empty());
    let rows = rows(state.store.as_ref(), since, until, service).await?;
    let map = of_rows(rows, since, until, group, service);
    let mut answer = to_json(&map);
    answer["since_unix_nano"] = json!(since);
    answer["until_unix_nano"] = json!(until);
    Ok(Json(answer))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::analyze::hops::{HopSample, add_edges, samples};
    use crate::core::analyze::{AnalyzeOptions, analyze, fixture::parse};

    fn rows(fixture: &str) -> (Vec<HopRollupRow>, Vec<(EdgeKey, EdgeRollup)>) {
        let spans = parse(fixture);
        let hops: Vec<HopSample> = samples(&spans, &analyze(&spans, &AnalyzeOptions::default()));
        let mut edges = BTreeMap::new();
        add_edges(&mut edges, &hops, 1);
        let hop_rows = hops
            .iter()
            .map(|h| {
                let mut rollup = Rollup::default();
                rollup.add(h, 1);
                HopRollupRow {
                    service: h.service.clone(),
                    operation: h.operation.clone(),
                    minute_unix_nano: 0,
                    rollup,
                }
            })
            .collect();
        (hop_rows, edges.into_iter().collect())
    }

    const SHOP: &str = r#"
edge server "GET /checkout" 0 900 budget=1000
  edge client "POST /orders" 10 800 budget=990
    orders server "POST /orders" 12 796 budget=400
      orders client "SELECT" 20 30 attr:server.address=db
      orders client "GET /stock" 60 100 budget=330
        inventory server "GET /stock" 61 98 budget=329
"#;

    #[test]
    fn services_edges_and_uninstrumented_peers() {
        let (hops, edges) = rows(SHOP);
        let map = build(hops, edges, Group::Service, None, 1.0);
        let names: Vec<(&str, bool)> = map
            .nodes
            .iter()
            .map(|n| (n.service.as_str(), n.instrumented))
            .collect();
        assert_eq!(
            names,
            [
                ("db", false),
                ("edge", true),
                ("inventory", true),
                ("orders", true)
            ]
        );
        let edge_to = |callee: &str| {
            map.edges
                .iter()
                .find(|e| map.nodes[e.callee].service == callee)
                .unwrap()
        };
        // 990 ms forwarded, 400 received: a proxy cut it.
        let orders = edge_to("orders");
        assert_eq!(map.nodes[orders.caller].service, "edge");
        assert_eq!(orders.health, Health::Bad);
        assert_eq!(orders.label, "100 % of calls clamped");
        assert_eq!(edge_to("inventory").label, "healthy");
        assert_eq!(edge_to("db").health, Health::Ok);
        assert_eq!(
            map.nodes[0].label, "not instrumented; called 1 times",
            "{:?}",
            map.nodes[0]
        );
        let json = to_json(&map);
        assert_eq!(json["edges"].as_array().unwrap().len(), 3);
        assert_eq!(json["group"], "service");
    }

    #[test]
    fn one_services_map_keeps_its_edges_and_their_ends() {
        let (hops, edges) = rows(SHOP);
        // The store keeps the edges that touch the service; build keeps its nodes.
        let edges: Vec<_> = edges
            .into_iter()
            .filter(|((a, _, c, _, _), _)| a == "inventory" || c == "inventory")
            .collect();
        let map = build(hops, edges, Group::Operation, Some("inventory"), 1.0);
        let names: Vec<String> = map
            .nodes
            .iter()
            .map(|n| format!("{} {}", n.service, n.operation.as_deref().unwrap_or("")))
            .collect();
        assert_eq!(names, ["inventory GET /stock", "orders POST /orders"]);
        assert_eq!(map.edges.len(), 1);
    }
}
