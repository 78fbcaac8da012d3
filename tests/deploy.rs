//! docker-compose's `grafana` profile, checked without a Docker engine: every file a
//! service mounts exists and parses; Prometheus scrapes the servers' UI port; Grafana's
//! data sources name compose services, and the Jaeger one's path is one a real server
//! answers; the dashboard uses only provisioned data sources and metrics a real server's
//! `/metrics` exposes.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::{TestDb, get_json, get_text, post_otlp, start, wait_until_searchable};
use serde_json::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn compose() -> Value {
    let text = std::fs::read_to_string(format!("{ROOT}/docker-compose.yml")).unwrap();
    serde_saphyr::from_str(&text).expect("docker-compose.yml is valid YAML")
}

fn read_yaml(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap();
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every file under `path` (itself when it is a file).
fn files(path: &Path) -> Vec<PathBuf> {
    if path.is_file() {
        return vec![path.to_path_buf()];
    }
    let mut all = Vec::new();
    for entry in std::fs::read_dir(path).unwrap() {
        all.extend(files(&entry.unwrap().path()));
    }
    all
}

/// The service's bind mounts from the repository: (file or directory, container path).
fn mounts(service: &Value) -> Vec<(PathBuf, String)> {
    service["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str())
        .filter(|v| v.starts_with("./"))
        .map(|v| {
            let mut parts = v.split(':');
            let source = Path::new(ROOT).join(parts.next().unwrap());
            (source, parts.next().expect("a container path").to_string())
        })
        .collect()
}

/// `http://HOST:PORT/PATH` → (HOST, PORT, /PATH).
fn split_url(url: &str) -> (String, String, String) {
    let rest = url.strip_prefix("http://").expect("http URL");
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (host, port) = authority.split_once(':').expect("a port");
    (host.to_string(), port.to_string(), format!("/{path}"))
}

#[test]
fn every_mounted_file_exists_and_parses_and_no_port_is_published_twice() {
    let compose = compose();
    let services = compose["services"].as_object().unwrap();
    for profiled in ["prometheus", "grafana"] {
        assert_eq!(
            services[profiled]["profiles"],
            serde_json::json!(["grafana"]),
            "{profiled} only runs with --profile grafana"
        );
    }
    let mut mounted = 0;
    let mut published = BTreeSet::new();
    for (name, service) in services {
        for (source, _) in mounts(service) {
            assert!(source.exists(), "{name}: {} is missing", source.display());
            for file in files(&source) {
                match file.extension().and_then(|e| e.to_str()) {
                    Some("yml" | "yaml") => {
                        read_yaml(&file);
                    }
                    Some("json") => {
                        let text = std::fs::read_to_string(&file).unwrap();
                        serde_json::from_str::<Value>(&text)
                            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
                    }
                    _ => panic!("{name}: {} is of no known kind", file.display()),
                }
                mounted += 1;
            }
        }
        for port in service["ports"].as_array().into_iter().flatten() {
            let port = port.as_str().unwrap();
            assert!(port.starts_with("127.0.0.1:"), "{name}: {port} on loopback");
            let host_port = port.split(':').nth(1).unwrap().to_string();
            assert!(
                published.insert(host_port),
                "{name}: {port} published twice"
            );
        }
    }
    assert!(
        mounted >= 4,
        "the profile's configuration files are mounted"
    );
}

#[test]
fn prometheus_scrapes_every_server_on_its_ui_port() {
    let compose = compose();
    let services = compose["services"].as_object().unwrap();
    let (config, target) = mounts(&services["prometheus"])
        .into_iter()
        .next()
        .expect("prometheus mounts its configuration");
    let command = services["prometheus"]["command"].to_string();
    assert!(
        command.contains(&format!("--config.file={target}")),
        "{command}"
    );
    let config = read_yaml(&config);
    let mut scraped = BTreeSet::new();
    for job in config["scrape_configs"].as_array().unwrap() {
        assert_eq!(job["metrics_path"], "/metrics");
        for target in job["static_configs"][0]["targets"].as_array().unwrap() {
            let (host, port) = target.as_str().unwrap().split_once(':').unwrap();
            assert!(
                services[host]["build"].is_string(),
                "{host} is a budgetscope server"
            );
            // The Dockerfile's BUDGETSCOPE_HTTP_ADDR.
            assert_eq!(port, "8080", "{host}");
            scraped.insert(host.to_string());
        }
    }
    let servers: BTreeSet<String> = services
        .iter()
        .filter(|(_, s)| s["build"].is_string())
        .map(|(name, _)| name.clone())
        .collect();
    assert_eq!(scraped, servers, "every server is scraped");
}

/// The provisioned data sources (uid → (type, url)) and the dashboards' container path.
fn grafana_provisioning() -> (Vec<(String, String, String)>, String, PathBuf) {
    let compose = compose();
    let grafana = &compose["services"]["grafana"];
    let mounts = mounts(grafana);
    let provisioning = mounts
        .iter()
        .find(|(_, target)| target == "/etc/grafana/provisioning")
        .expect("grafana mounts its provisioning directory");
    let sources = read_yaml(&provisioning.0.join("datasources/budgetscope.yml"));
    let sources = sources["datasources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["uid"].as_str().unwrap().to_string(),
                s["type"].as_str().unwrap().to_string(),
                s["url"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let providers = read_yaml(&provisioning.0.join("dashboards/budgetscope.yml"));
    let path = providers["providers"][0]["options"]["path"]
        .as_str()
        .unwrap()
        .to_string();
    let dashboards = mounts
        .iter()
        .find(|(_, target)| *target == path)
        .unwrap_or_else(|| panic!("the dashboards provider's {path} is mounted"))
        .0
        .clone();
    (sources, path, dashboards)
}

/// Every `expr` and variable `query` string in a dashboard, and every data source uid.
fn walk(value: &Value, exprs: &mut Vec<String>, uids: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr" | "definition", Value::String(text)) => exprs.push(text.clone()),
                    ("datasource", Value::Object(source)) => {
                        uids.insert(source["uid"].as_str().unwrap().to_string());
                    }
                    _ => walk(value, exprs, uids),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| walk(v, exprs, uids)),
        _ => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grafana_reads_budgetscope_through_paths_and_metrics_a_real_server_serves() {
    let compose = compose();
    let services = compose["services"].as_object().unwrap();
    let (sources, _, dashboards) = grafana_provisioning();
    let db = TestDb::sqlite();
    // A rule that fires on the trace below, so the alert families have series too.
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yml");
    std::fs::write(
        &rules,
        "rules:\n  - { name: edge-burning, service: edge, signal: local_exceed_ratio, op: \">\", threshold: 0.5, window: 5m }\n",
    )
    .unwrap();
    let flags = [
        "--quiet-period",
        "1s",
        "--rules",
        rules.to_str().unwrap(),
        "--alert-interval",
        "1s",
        "--alert-delay",
        "0s",
    ];
    let server = start(&db, &flags).await;
    // One analysed trace with every per-hop number (edge runs out of budget in its own
    // work after giving up on inventory, which works on), so each family has series.
    let mut spans = common::fixture_trace(
        7,
        r#"
edge server "GET /checkout" 0 1540 budget=800
  edge client "GET /stock" 20 300 budget=5000
    inventory server "GET /stock" 25 1490 budget=5000
"#,
    );
    let shift =
        common::now_nanos() - 60_000_000_000 - budgetscope::core::analyze::fixture::BASE_UNIX_NANO;
    for span in &mut spans {
        span.start_unix_nano += shift;
        span.end_unix_nano += shift;
    }
    post_otlp(&server, &budgetscope::otlp::download::to_request(&spans)).await;
    wait_until_searchable(&server, "service=edge", &spans[0].trace_id.to_string()).await;
    let waited = std::time::Instant::now();
    while !get_text(&server, "/metrics")
        .await
        .contains("budgetscope_alert_instances{")
    {
        assert!(waited.elapsed().as_secs() < 30, "the rule never fired");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }

    let mut kinds = BTreeSet::new();
    for (uid, kind, url) in &sources {
        let (host, port, path) = split_url(url);
        assert!(services.contains_key(&host), "{uid}: no service {host}");
        match kind.as_str() {
            "jaeger" => {
                assert!(
                    services[&host]["build"].is_string(),
                    "{uid}: a budgetscope server"
                );
                assert_eq!(port, "8080", "{uid}");
                // Grafana's Jaeger data source appends /api/services, /api/traces, ….
                let (status, body) = get_json(&server, &format!("{path}/api/services")).await;
                assert_eq!(status, 200, "{uid}: {path}/api/services: {body}");
                assert!(body["data"].is_array(), "{body}");
            }
            "prometheus" => assert_eq!(port, "9090", "{uid}"),
            other => panic!("{uid}: unexpected data source type {other}"),
        }
        kinds.insert(kind.clone());
    }
    assert_eq!(
        kinds,
        BTreeSet::from(["jaeger".into(), "prometheus".into()])
    );

    // Metric families the server exposes (the OpenMetrics TYPE lines).
    let metrics = get_text(&server, "/metrics").await;
    let families: BTreeSet<&str> = metrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_whitespace().next())
        .collect();
    assert!(families.contains("budgetscope_hop_requests"), "{metrics}");
    let provisioned: BTreeSet<String> = sources.iter().map(|(uid, _, _)| uid.clone()).collect();
    let mut checked = 0;
    for file in files(&dashboards) {
        let dashboard: Value =
            serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        let (mut exprs, mut uids) = (Vec::new(), BTreeSet::new());
        walk(&dashboard, &mut exprs, &mut uids);
        assert!(
            uids.is_subset(&provisioned),
            "{}: data sources {uids:?} not all provisioned ({provisioned:?})",
            file.display()
        );
        for expr in &exprs {
            for name in expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|word| word.starts_with("budgetscope_"))
            {
                let family = ["_total", "_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|suffix| name.strip_suffix(suffix))
                    .unwrap_or(name);
                assert!(
                    families.contains(family),
                    "{}: {name} in {expr:?} is not on /metrics",
                    file.display()
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 10, "the dashboard's queries were read");
    server.shutdown().await;
}
