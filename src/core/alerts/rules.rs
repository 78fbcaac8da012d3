//! Alert rules and receivers: the YAML rules file (`--rules`, `budgetscope rules check`),
//! validated into `Rule` and `ReceiverConfig`. Pure: text in, rules or errors out.
//!
//! Every error names the rule (by name, or by position when it has none) and the field, so
//! `rules check` can be run in CI on the file a team keeps next to its services.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::core::analyze::Flag;

/// Declares `Signal` with each variant's name in rules, `ALL` and `as_str`.
macro_rules! signals {
    ($($(#[$doc:meta])* $variant:ident = $name:literal,)*) => {
        /// What a rule watches on each hop, computed from the hop rollups of its window.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Signal {
            $($(#[$doc])* $variant,)*
        }

        impl Signal {
            pub const ALL: [Signal; [$($name),*].len()] = [$(Signal::$variant),*];

            pub fn as_str(self) -> &'static str {
                match self {
                    $(Signal::$variant => $name,)*
                }
            }
        }
    };
}

signals! {
    /// Local exceeds ÷ (requests − inherited exceeds): the hop's own fault.
    LocalExceedRatio = "local_exceed_ratio",
    InheritedExceedRatio = "inherited_exceed_ratio",
    OverspentRatio = "overspent_ratio",
    Requests = "requests",
    LocalExceedCount = "local_exceed_count",
    InheritedExceedCount = "inherited_exceed_count",
    InflatedCount = "inflated_count",
    DroppedCount = "dropped_count",
    DoomedCount = "doomed_count",
    /// Retried calls the hop made ÷ requests.
    RetryRatio = "retry_ratio",
    WastedMs = "wasted_ms",
    BurnP95 = "burn_p95",
    BurnP99 = "burn_p99",
    SelfMsP95 = "self_ms_p95",
    BudgetReceivedP50 = "budget_received_p50",
    /// Of the exceeded requests through the hop, the share whose critical hop it was: how
    /// often its own work made a late request late.
    CriticalShare = "critical_share",
    /// Local exceed ratio ÷ (1 − objective), over `window` and `short_window` both.
    SloBurnRate = "slo_burn_rate",
    /// From the hop's deadline metrics (every request, not only sampled traces).
    MetricLocalExceedCount = "metric_local_exceed_count",
    MetricInheritedExceedCount = "metric_inherited_exceed_count",
    /// Metrics' local exceeds ÷ (budgets received − inherited exceeds).
    MetricLocalExceedRatio = "metric_local_exceed_ratio",
    /// The advisor's findings of each kind over the window (`core::advice`): the requests
    /// (calls) a finding of that kind at the hop is about, 0 when there is none; an edge's
    /// finding counts at its calling hop. `> 0` fires when the finding appears.
    FindingDropped = "finding_dropped",
    FindingClamped = "finding_clamped",
    FindingFixedTimeout = "finding_fixed_timeout",
    FindingRetryBudget = "finding_retry_budget",
    FindingTimeoutBackstop = "finding_timeout_backstop",
    FindingInflatingHop = "finding_inflating_hop",
    FindingMinUsefulBudget = "finding_min_useful_budget",
    FindingReserve = "finding_reserve",
    FindingRetryLayers = "finding_retry_layers",
    FindingInfeasibleBudget = "finding_infeasible_budget",
}

impl Signal {
    pub fn parse(text: &str) -> Option<Signal> {
        Signal::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// Rules whose signals share a family inhibit each other along the call chain: a hop
    /// firing because of the requests another firing hop sent it already spent is shown as
    /// inhibited by that hop. The deadline-exceed signals form one family; any other
    /// signal is a family of its own.
    pub fn family(self) -> &'static str {
        match self {
            Signal::LocalExceedRatio
            | Signal::LocalExceedCount
            | Signal::InheritedExceedRatio
            | Signal::InheritedExceedCount
            | Signal::OverspentRatio
            | Signal::DoomedCount
            | Signal::SloBurnRate
            | Signal::MetricLocalExceedCount
            | Signal::MetricInheritedExceedCount
            | Signal::MetricLocalExceedRatio => "deadline_exceeded",
            other => other.as_str(),
        }
    }

    /// Whether the signal reads the deadline metrics the hops export rather than the traces:
    /// their requests are the metrics' too (budgets received), for `min_requests`.
    pub fn reads_metrics(self) -> bool {
        matches!(
            self,
            Signal::MetricLocalExceedCount
                | Signal::MetricInheritedExceedCount
                | Signal::MetricLocalExceedRatio
        )
    }

    /// The advisor's finding kind a `finding_*` signal watches.
    pub fn finding_kind(self) -> Option<&'static str> {
        self.as_str().strip_prefix("finding_")
    }

    /// The flag whose traces show the problem, for example traces in notifications.
    pub fn flag(self) -> Option<Flag> {
        if let Some(kind) = self.finding_kind() {
            return crate::core::advice::example_flag(kind);
        }
        match self {
            Signal::LocalExceedRatio
            | Signal::LocalExceedCount
            | Signal::SloBurnRate
            | Signal::MetricLocalExceedCount
            | Signal::MetricLocalExceedRatio => Some(Flag::LocalExceed),
            Signal::InheritedExceedRatio
            | Signal::InheritedExceedCount
            | Signal::MetricInheritedExceedCount => Some(Flag::InheritedExceed),
            Signal::OverspentRatio | Signal::BurnP95 | Signal::BurnP99 => Some(Flag::Overspent),
            Signal::InflatedCount => Some(Flag::Inflated),
            Signal::DroppedCount => Some(Flag::Dropped),
            Signal::DoomedCount => Some(Flag::Doomed),
            Signal::RetryRatio => Some(Flag::Retry),
            Signal::WastedMs => Some(Flag::Wasted),
            _ => None,
        }
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The comparison between a signal's value and a threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Gt,
    Ge,
    Lt,
    Le,
}

impl Op {
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Gt => ">",
            Op::Ge => ">=",
            Op::Lt => "<",
            Op::Le => "<=",
        }
    }

    pub fn parse(text: &str) -> Option<Op> {
        [Op::Gt, Op::Ge, Op::Lt, Op::Le]
            .into_iter()
            .find(|op| op.as_str() == text)
    }

    pub fn holds(self, value: f64, threshold: f64) -> bool {
        match self {
            Op::Gt => value > threshold,
            Op::Ge => value >= threshold,
            Op::Lt => value < threshold,
            Op::Le => value <= threshold,
        }
    }

    /// Whether `a` is a stricter threshold than `b` (further into the alerting side).
    fn stricter(self, a: f64, b: f64) -> bool {
        match self {
            Op::Gt | Op::Ge => a > b,
            Op::Lt | Op::Le => a < b,
        }
    }
}

/// A glob over service or operation names: `*` any run of characters, `?` one, `[abc]` a
/// class, `{a,b}` alternatives. `/` is an ordinary character (operations are often paths).
#[derive(Debug, Clone)]
pub struct NamePattern {
    text: String,
    matcher: Option<globset::GlobMatcher>,
}

impl NamePattern {
    pub fn parse(text: &str) -> Result<NamePattern, String> {
        let wild = text.contains(['*', '?', '[', '{']);
        let matcher = if wild {
            let glob = globset::GlobBuilder::new(text)
                .literal_separator(false)
                .backslash_escape(true)
                .build()
                .map_err(|e| format!("not a valid glob: {}", e.kind()))?;
            Some(glob.compile_matcher())
        } else {
            None
        };
        Ok(NamePattern {
            text: text.to_string(),
            matcher,
        })
    }

    pub fn any() -> NamePattern {
        NamePattern::parse("*").unwrap_or(NamePattern {
            text: "*".into(),
            matcher: None,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The literal start every match has, when the pattern is that start followed by `*`.
    pub fn prefix(&self) -> Option<&str> {
        let start = self.text.strip_suffix('*')?;
        (!start.contains(['*', '?', '[', '{', '\\'])).then_some(start)
    }

    /// The one name this pattern matches, when it has no wildcard.
    pub fn literal(&self) -> Option<&str> {
        self.matcher.is_none().then_some(self.text.as_str())
    }

    pub fn matches(&self, name: &str) -> bool {
        match &self.matcher {
            None => self.text == name,
            Some(_) if self.text == "*" => true,
            Some(matcher) => matcher.is_match(name),
        }
    }
}

impl PartialEq for NamePattern {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

/// Where a rule came from: the rules file (read-only in the UI) or the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RuleSource {
    File,
    Database,
}

/// A validated rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub name: String,
    pub service: NamePattern,
    pub operation: NamePattern,
    pub signal: Signal,
    /// For `slo_burn_rate`: the share of requests that must not exceed locally, e.g. 0.99.
    pub objective: Option<f64>,
    /// For `slo_burn_rate`: the second, shorter window that must exceed too.
    pub short_window: Option<Duration>,
    pub op: Op,
    /// The critical threshold.
    pub threshold: f64,
    /// A less strict threshold at which the instance fires with severity `warning`.
    pub warning: Option<f64>,
    /// Once firing, the instance stays firing until the value is past this (hysteresis).
    pub resolve_threshold: Option<f64>,
    pub window: Duration,
    pub for_: Duration,
    pub keep_firing_for: Duration,
    /// While firing, notify again this often (none: once per episode).
    pub repeat_interval: Option<Duration>,
    pub min_requests: i64,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub receivers: Vec<String>,
    pub paused: bool,
    pub source: RuleSource,
}

impl Rule {
    /// The threshold that clears a firing instance.
    pub fn clear_threshold(&self) -> f64 {
        self.resolve_threshold
            .unwrap_or(loosest(self.op, self.threshold, self.warning))
    }
}

/// The looser of the critical and the warning threshold: the one a value passes first.
fn loosest(op: Op, threshold: f64, warning: Option<f64>) -> f64 {
    match warning {
        Some(w) if op.stricter(threshold, w) => w,
        _ => threshold,
    }
}

/// A place notifications go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiverConfig {
    pub name: String,
    pub kind: ReceiverKind,
    pub url: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReceiverKind {
    /// POST of the Alertmanager webhook JSON (version 4), with budgetscope's evidence.
    Webhook,
    /// POST `/api/v2/alerts` of an Alertmanager, re-sent while firing.
    Alertmanager,
    /// A Slack incoming webhook (`text`).
    Slack,
}

impl ReceiverKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ReceiverKind::Webhook => "webhook",
            ReceiverKind::Alertmanager => "alertmanager",
            ReceiverKind::Slack => "slack",
        }
    }
}

/// What a rules file holds, validated.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RuleSet {
    pub rules: Vec<Rule>,
    pub receivers: Vec<ReceiverConfig>,
}

/// A rule as written in YAML or sent to the API, before validation.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RuleSpec {
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
    pub signal: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub objective: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub short_window: Option<String>,
    pub op: Option<String>,
    pub threshold: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resolve_threshold: Option<f64>,
    pub window: Option<String>,
    #[serde(rename = "for", skip_serializing_if = "Option::is_none")]
    pub for_: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keep_firing_for: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repeat_interval: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_requests: Option<i64>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub receivers: Vec<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct UrlSpec {
    url: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct ReceiverSpec {
    name: Option<String>,
    webhook: Option<UrlSpec>,
    alertmanager: Option<UrlSpec>,
    slack: Option<UrlSpec>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct FileSpec {
    rules: Vec<RuleSpec>,
    receivers: Vec<ReceiverSpec>,
}

/// One problem in a rules file or a rule, naming where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleError {
    /// `rule "name"`, `rules[3]` or `receiver "ops"`; empty for the file as a whole.
    pub place: String,
    /// The field, as written in YAML; empty when the problem is not one field's.
    pub field: String,
    pub problem: String,
}

impl fmt::Display for RuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.place.is_empty(), self.field.is_empty()) {
            (true, _) => write!(f, "{}", self.problem),
            (false, true) => write!(f, "{}: {}", self.place, self.problem),
            (false, false) => write!(f, "{}, field {}: {}", self.place, self.field, self.problem),
        }
    }
}

/// The longest window a rule may look at: rollups are kept as long as spans, and a day of
/// minute rows per hop is what one evaluation reads at most.
pub const MAX_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// Parses and validates a rules file. All problems are reported, not only the first.
pub fn parse_file(text: &str) -> Result<RuleSet, Vec<RuleError>> {
    let file_error = |problem: String| RuleError {
        place: String::new(),
        field: String::new(),
        problem,
    };
    if text.trim().is_empty() {
        return Ok(RuleSet::default());
    }
    let spec: FileSpec = serde_saphyr::from_str(text)
        .map_err(|e| vec![file_error(format!("not a valid rules file: {e}"))])?;
    let mut errors = Vec::new();
    let mut receivers = Vec::new();
    for (i, spec) in spec.receivers.iter().enumerate() {
        match validate_receiver(spec, i) {
            Ok(receiver) => receivers.push(receiver),
            Err(error) => errors.push(error),
        }
    }
    let mut seen = BTreeSet::new();
    for receiver in &receivers {
        if !seen.insert(receiver.name.clone()) {
            errors.push(RuleError {
                place: format!("receiver {:?}", receiver.name),
                field: "name".into(),
                problem: "another receiver has this name".into(),
            });
        }
    }
    let known: BTreeSet<&str> = receivers.iter().map(|r| r.name.as_str()).collect();
    let mut rules = Vec::new();
    let mut names = BTreeSet::new();
    for (i, spec) in spec.rules.iter().enumerate() {
        match validate_rule(spec, &format!("rules[{i}]"), RuleSource::File, &known) {
            Ok(rule) => {
                if !names.insert(rule.name.clone()) {
                    errors.push(RuleError {
                        place: format!("rule {:?}", rule.name),
                        field: "name".into(),
                        problem: "another rule has this name; names must be unique".into(),
                    });
                }
                rules.push(rule);
            }
            Err(mut found) => errors.append(&mut found),
        }
    }
    if errors.is_empty() {
        Ok(RuleSet { rules, receivers })
    } else {
        Err(errors)
    }
}

fn validate_receiver(spec: &ReceiverSpec, index: usize) -> Result<ReceiverConfig, RuleError> {
    let name = spec.name.clone().unwrap_or_default();
    let place = if name.is_empty() {
        format!("receivers[{index}]")
    } else {
        format!("receiver {name:?}")
    };
    let error = |field: &str, problem: &str| RuleError {
        place: place.clone(),
        field: field.into(),
        problem: problem.into(),
    };
    if name.trim().is_empty() {
        return Err(error(
            "name",
            "missing; give the receiver a name rules can refer to",
        ));
    }
    let kinds: Vec<(ReceiverKind, &UrlSpec)> = [
        (ReceiverKind::Webhook, spec.webhook.as_ref()),
        (ReceiverKind::Alertmanager, spec.alertmanager.as_ref()),
        (ReceiverKind::Slack, spec.slack.as_ref()),
    ]
    .into_iter()
    .filter_map(|(kind, url)| url.map(|u| (kind, u)))
    .collect();
    let [(kind, url)] = kinds.as_slice() else {
        return Err(error(
            "webhook",
            "give exactly one of webhook, alertmanager or slack, each with a url",
        ));
    };
    let url = url.url.trim();
    if !(url.starts_with("http://") || url.starts_with("https://"))
        || url.contains(char::is_whitespace)
    {
        return Err(error(
            &format!("{}.url", kind.as_str()),
            "expected an http:// or https:// URL",
        ));
    }
    Ok(ReceiverConfig {
        name,
        kind: *kind,
        url: url.to_string(),
    })
}

/// A field every rule needs: `text` parsed, or what is wrong (`missing` says what to give).
fn required<T>(
    text: Option<&str>,
    missing: &str,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Result<T, String> {
    text.map_or_else(
        || Err(format!("missing; {missing}")),
        |text| parse(text.trim()),
    )
}

fn parse_window(text: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(text.trim())
        .map_err(|_| "expected a duration such as 5m, 1h or 30s".to_string())?;
    if duration < Duration::from_secs(60) {
        return Err("must be at least 1m: hop statistics are kept per minute".into());
    }
    if duration > MAX_WINDOW {
        return Err("must be at most 24h".into());
    }
    Ok(duration)
}

fn parse_wait(text: &str) -> Result<Duration, String> {
    match text.trim() {
        "0" => Ok(Duration::ZERO),
        text => humantime::parse_duration(text)
            .map_err(|_| "expected a duration such as 2m, 30s or 0".to_string()),
    }
}

/// Validates one rule; `place` names it in errors until its name is known. `receivers`
/// are the names a rule may send to.
pub fn validate_rule(
    spec: &RuleSpec,
    place: &str,
    source: RuleSource,
    receivers: &BTreeSet<&str>,
) -> Result<Rule, Vec<RuleError>> {
    let name = spec.name.as_deref().unwrap_or("").trim().to_string();
    let place = if name.is_empty() {
        place.to_string()
    } else {
        format!("rule {name:?}")
    };
    let mut errors = Vec::new();
    let mut error = |field: &str, problem: String| {
        errors.push(RuleError {
            place: place.clone(),
            field: field.into(),
            problem,
        })
    };
    if name.is_empty() {
        error("name", "missing; every rule needs a unique name".into());
    } else if name.len() > 200 || name.chars().any(char::is_control) {
        error(
            "name",
            "must be at most 200 characters, without control characters".into(),
        );
    }
    let mut pattern = |field: &str, text: &Option<String>| match text.as_deref() {
        None | Some("") => NamePattern::any(),
        Some(text) => NamePattern::parse(text).unwrap_or_else(|problem| {
            error(field, problem);
            NamePattern::any()
        }),
    };
    let service = pattern("service", &spec.service);
    let operation = pattern("operation", &spec.operation);
    let names = signal_names();
    let signal = required(spec.signal.as_deref(), &format!("one of {names}"), |text| {
        Signal::parse(text).ok_or_else(|| format!("unknown {text:?}; one of {names}"))
    })
    .unwrap_or_else(|p| {
        error("signal", p);
        Signal::LocalExceedRatio
    });
    let op = required(spec.op.as_deref(), "one of >, >=, <, <=", |text| {
        Op::parse(text).ok_or_else(|| format!("unknown {text:?}; one of >, >=, <, <="))
    })
    .unwrap_or_else(|p| {
        error("op", p);
        Op::Gt
    });
    let mut number = |field: &str, value: Option<f64>| {
        if let Some(v) = value
            && !v.is_finite()
        {
            error(field, "must be a finite number".into());
        }
        value
    };
    let threshold = number("threshold", spec.threshold);
    let warning = number("warning", spec.warning);
    let resolve_threshold = number("resolve_threshold", spec.resolve_threshold);
    let objective = number("objective", spec.objective);
    let given = threshold.is_some();
    let threshold = threshold.unwrap_or_else(|| {
        error(
            "threshold",
            "missing; the value at which the rule fires".into(),
        );
        0.0
    });
    if let Some(w) = warning
        && given
        && !op.stricter(threshold, w)
    {
        error(
            "warning",
            format!(
                "must be reached before the critical threshold: with op {} it must be {} than {threshold}",
                op.as_str(),
                if matches!(op, Op::Gt | Op::Ge) {
                    "lower"
                } else {
                    "higher"
                }
            ),
        );
    }
    let loosest = loosest(op, threshold, warning);
    if let Some(r) = resolve_threshold
        && op.stricter(r, loosest)
    {
        error(
            "resolve_threshold",
            format!(
                "must be on the healthy side of the firing threshold {loosest} (a value that fires cannot resolve)"
            ),
        );
    }
    let window = required(
        spec.window.as_deref(),
        "how much history each evaluation looks at, e.g. 5m",
        parse_window,
    )
    .unwrap_or_else(|p| {
        error("window", p);
        Duration::from_secs(300)
    });
    let short_window = match spec.short_window.as_deref() {
        None => None,
        Some(text) => match parse_window(text) {
            Ok(short) if short >= window => {
                error("short_window", "must be shorter than window".into());
                None
            }
            Ok(short) => Some(short),
            Err(p) => {
                error("short_window", p);
                None
            }
        },
    };
    if signal == Signal::SloBurnRate {
        match objective {
            Some(o) if o > 0.0 && o < 1.0 => {}
            Some(_) => error("objective", "must be between 0 and 1, e.g. 0.99".into()),
            None => error(
                "objective",
                "missing; slo_burn_rate needs the objective, e.g. 0.99".into(),
            ),
        }
    } else {
        if objective.is_some() {
            error("objective", "only slo_burn_rate uses an objective".into());
        }
        if spec.short_window.is_some() {
            error(
                "short_window",
                "only slo_burn_rate uses a short window".into(),
            );
        }
    }
    let mut wait = |field: &str, text: &Option<String>| match text.as_deref() {
        None => Duration::ZERO,
        Some(text) => parse_wait(text).unwrap_or_else(|p| {
            error(field, p);
            Duration::ZERO
        }),
    };
    let for_ = wait("for", &spec.for_);
    let keep_firing_for = wait("keep_firing_for", &spec.keep_firing_for);
    let repeat_interval = match wait("repeat_interval", &spec.repeat_interval) {
        d if d.is_zero() && spec.repeat_interval.is_some() => {
            error(
                "repeat_interval",
                "must be longer than 0, e.g. 4h; leave it out to notify once".into(),
            );
            None
        }
        d if d.is_zero() => None,
        d => Some(d),
    };
    let min_requests = spec.min_requests.unwrap_or(0);
    if min_requests < 0 {
        error("min_requests", "must be 0 or more".into());
    }
    for key in spec.labels.keys() {
        if !valid_label_name(key) {
            error(
                "labels",
                format!(
                    "{key:?} is not a label name (letters, digits and _, not starting with a digit)"
                ),
            );
        } else if RESERVED_LABELS.contains(&key.as_str()) {
            error(
                "labels",
                format!("{key:?} is set by budgetscope; choose another name"),
            );
        }
    }
    for (key, template) in &spec.annotations {
        if !valid_label_name(key) {
            error("annotations", format!("{key:?} is not an annotation name"));
        }
        if let Err(p) = check_template(template) {
            error("annotations", format!("{key}: {p}"));
        }
    }
    for receiver in &spec.receivers {
        if !receivers.contains(receiver.as_str()) {
            error(
                "receivers",
                format!(
                    "no receiver is named {receiver:?}; define it under receivers: (known: {})",
                    if receivers.is_empty() {
                        "none".to_string()
                    } else {
                        receivers.iter().copied().collect::<Vec<_>>().join(", ")
                    }
                ),
            );
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(Rule {
        name,
        service,
        operation,
        signal,
        objective,
        short_window,
        op,
        threshold,
        warning,
        resolve_threshold,
        window,
        for_,
        keep_firing_for,
        repeat_interval,
        min_requests,
        labels: spec.labels.clone(),
        annotations: spec.annotations.clone(),
        receivers: spec.receivers.clone(),
        paused: spec.paused,
        source,
    })
}

/// Labels every alert carries, which a rule may not set itself.
pub const RESERVED_LABELS: [&str; 4] = ["alertname", "service", "operation", "severity"];

fn valid_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn signal_names() -> String {
    Signal::ALL.map(Signal::as_str).join(", ")
}

/// The placeholders annotations may use.
pub const TEMPLATE_FIELDS: [&str; 4] = ["service", "operation", "value", "threshold"];

fn check_template(template: &str) -> Result<(), String> {
    // Rendering leaves unknown placeholders and an unclosed `{{` as written.
    let rendered = render_template(template, &TEMPLATE_FIELDS.map(|field| (field, "")));
    let Some(open) = rendered.find("{{") else {
        return Ok(());
    };
    let after = &rendered[open + 2..];
    let close = after.find("}}").ok_or("a {{ is not closed with }}")?;
    let field = after[..close].trim();
    let known = TEMPLATE_FIELDS.map(|f| format!("{{{{{f}}}}}")).join(", ");
    Err(format!("unknown placeholder {{{{{field}}}}}; use {known}"))
}

/// Fills an annotation's placeholders.
pub fn render_template(template: &str, fields: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find("{{") {
        out.push_str(&rest[..open]);
        let after = &rest[open + 2..];
        let Some(close) = after.find("}}") else {
            out.push_str(&rest[open..]);
            return out;
        };
        let field = after[..close].trim();
        match fields.iter().find(|(name, _)| *name == field) {
            Some((_, value)) => out.push_str(value),
            None => out.push_str(&rest[open..open + close + 4]),
        }
        rest = &after[close + 2..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
#[path = "rules_tests.rs"]
mod tests;
