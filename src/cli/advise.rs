//! `budgetscope advise`: the advisor's findings in a terminal or a CI job, from a database
//! (`--db`, read directly) or from a running server (`--server`, its `GET /api/advisor`).
//! Both print the same JSON objects the API answers, as text or (`--json`) as they are.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Args;
use serde_json::Value;

use crate::core::analyze::AnalyzeOptions;
use crate::web::AppState;

#[derive(Debug, Clone, Args)]
pub struct AdviseArgs {
    /// Database to read: sqlite://FILE or postgres://…. A SQLite file that a running server
    /// holds cannot be opened beside it: ask that server with --server instead.
    #[arg(
        long,
        env = "BUDGETSCOPE_DB",
        default_value = "sqlite://budgetscope.db"
    )]
    pub db: String,
    /// Ask a running server instead of reading a database: its UI/API address, e.g.
    /// http://127.0.0.1:8080.
    #[arg(long)]
    pub server: Option<String>,
    /// API token for --server, when the server requires one.
    #[arg(long, env = "BUDGETSCOPE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// How far back to look, up to now: e.g. 1h, 24h, 7d.
    #[arg(long, default_value = "1h")]
    pub since: String,
    /// Only the findings about this service (its hops, and edges it calls from).
    #[arg(long)]
    pub service: Option<String>,
    /// Print the API's JSON ({"findings": […]}) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Exit with status 3 when there is any finding (for a CI job that should fail then).
    #[arg(long)]
    pub fail_on_finding: bool,
    /// Tolerance τ in milliseconds the findings use with --db (a server uses its own).
    #[arg(long, default_value = "50")]
    pub tolerance_ms: f64,
}

/// Runs the command; `Ok(true)` when there were findings.
pub async fn run(args: AdviseArgs) -> anyhow::Result<bool> {
    humantime::parse_duration(&args.since).with_context(|| {
        format!(
            "invalid --since {:?}: expected e.g. 1h, 24h or 7d",
            args.since
        )
    })?;
    if !(args.tolerance_ms.is_finite() && args.tolerance_ms >= 0.0) {
        bail!(
            "invalid --tolerance-ms {}: expected a number of milliseconds ≥ 0",
            args.tolerance_ms
        );
    }
    let answer = match &args.server {
        Some(server) => ask_server(server, args.token.as_deref(), &args).await?,
        None => read_database(&args).await?,
    };
    let findings = answer["findings"].as_array().cloned().unwrap_or_default();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&answer)?);
    } else {
        print!("{}", text(&findings, &args.since));
    }
    Ok(!findings.is_empty())
}

async fn read_database(args: &AdviseArgs) -> anyhow::Result<Value> {
    let store = crate::store::open(&args.db).await.with_context(|| {
        format!(
            "could not open --db {} (to ask a running server instead, give --server \
                 http://ITS-UI-ADDRESS)",
            args.db
        )
    })?;
    let state = AppState::new(
        store,
        AnalyzeOptions {
            tolerance_ms: args.tolerance_ms,
        },
    );
    let mut params = BTreeMap::from([("since".to_string(), format!("-{}", args.since))]);
    if let Some(service) = &args.service {
        params.insert("service".into(), service.clone());
    }
    Ok(crate::web::advisor::answer(&state, &params).await?)
}

async fn ask_server(server: &str, token: Option<&str>, args: &AdviseArgs) -> anyhow::Result<Value> {
    let mut url = reqwest::Url::parse(server)
        .and_then(|base| base.join("/api/advisor"))
        .with_context(|| {
            format!("invalid --server {server:?}: expected e.g. http://127.0.0.1:8080")
        })?;
    url.query_pairs_mut()
        .append_pair("since", &format!("-{}", args.since));
    if let Some(service) = &args.service {
        url.query_pairs_mut().append_pair("service", service);
    }
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()?;
    let mut request = client.get(url.clone());
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.with_context(|| {
        format!("could not reach {url}; is `budgetscope serve` running there (its UI/API address)?")
    })?;
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    if !status.is_success() {
        bail!("{url} answered {status}: {}", body.trim());
    }
    serde_json::from_str(&body).with_context(|| format!("{url} did not answer JSON"))
}

/// The findings as a person reads them: grouped as the page groups them, each with its
/// numbers, the change and its example traces.
fn text(findings: &[Value], since: &str) -> String {
    use std::fmt::Write as _;
    let str_of = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let hop = |v: &Value| match v["operation"].as_str() {
        Some(operation) => format!("{} {operation}", str_of(&v["service"])),
        None => str_of(&v["service"]),
    };
    let mut out = String::new();
    if findings.is_empty() {
        let _ = writeln!(out, "Nothing to change in the last {since}.");
        return out;
    }
    let _ = writeln!(
        out,
        "{} finding{} in the last {since}, the largest impact first:\n",
        findings.len(),
        if findings.len() == 1 { "" } else { "s" }
    );
    for finding in findings {
        let subject = if finding["hop"].is_object() {
            hop(&finding["hop"])
        } else {
            format!("{} → {}", hop(&finding["caller"]), hop(&finding["callee"]))
        };
        let value = match (finding["value_ms"].as_f64(), finding["value"].as_f64()) {
            (Some(ms), _) => format!(" · {} ms", crate::core::analyze::fmt_ms(ms)),
            (None, Some(n)) => format!(" · {n:.0} calls"),
            _ => String::new(),
        };
        let _ = writeln!(out, "{}  {subject}{value}", str_of(&finding["kind"]));
        let _ = writeln!(out, "  {}.", str_of(&finding["message"]));
        let _ = writeln!(out, "  Change: {}.", str_of(&finding["recommendation"]));
        let traces: Vec<String> = finding["example_traces"]
            .as_array()
            .into_iter()
            .flatten()
            .map(str_of)
            .collect();
        if !traces.is_empty() {
            let _ = writeln!(out, "  Traces: {}", traces.join(", "));
        }
        out.push('\n');
    }
    out
}
