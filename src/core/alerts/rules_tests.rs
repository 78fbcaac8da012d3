//! Tests of `rules.rs`: parsing, validation messages, globs and templates.

use super::*;

const EXAMPLE: &str = r#"
receivers:
  - name: ops
    webhook: { url: "http://hooks.internal/budget" }
  - name: am
    alertmanager: { url: "http://alertmanager:9093" }
  - name: chat
    slack: { url: "https://hooks.slack.example/T000" }
rules:
  - name: inventory-burning
    service: inventory          # glob, default "*"
    operation: "*"
    signal: local_exceed_ratio
    op: ">"
    threshold: 0.05
    window: 5m
    for: 2m
    min_requests: 20
    labels: { team: stock }
    annotations: { summary: "{{service}} {{operation}} burns its own budget: {{value}}" }
    receivers: [ops, am]
"#;

#[test]
fn the_documented_example_parses() {
    let set = parse_file(EXAMPLE).unwrap();
    assert_eq!(set.receivers.len(), 3);
    assert_eq!(set.receivers[1].kind, ReceiverKind::Alertmanager);
    let rule = &set.rules[0];
    assert_eq!(rule.name, "inventory-burning");
    assert_eq!(rule.signal, Signal::LocalExceedRatio);
    assert_eq!(rule.op, Op::Gt);
    assert_eq!(rule.window, Duration::from_secs(300));
    assert_eq!(rule.for_, Duration::from_secs(120));
    assert_eq!(rule.min_requests, 20);
    assert!(rule.service.matches("inventory") && !rule.service.matches("billing"));
    assert!(rule.operation.matches("GET /items/{id}"));
    assert_eq!(rule.labels["team"], "stock");
    assert_eq!(rule.receivers, ["ops", "am"]);
    assert_eq!(rule.source, RuleSource::File);
}

#[test]
fn every_problem_names_its_rule_and_field() {
    let text = r#"
receivers:
  - name: ops
    webhook: { url: "ftp://x" }
  - webhook: { url: "http://x" }
rules:
  - signal: local_exceed_ratio
    op: ">"
    threshold: 0.1
    window: 5m
  - name: bad
    signal: local_exceed_rate
    op: "=>"
    window: 10s
    for: soon
    warning: 0.5
    labels: { severity: high, "9x": y }
    annotations: { summary: "{{hop}} is slow" }
    receivers: [pager]
  - name: slo
    signal: slo_burn_rate
    op: ">"
    threshold: 14.4
    window: 1h
    short_window: 2h
  - name: hysteresis
    signal: overspent_ratio
    op: ">"
    threshold: 0.2
    warning: 0.1
    resolve_threshold: 0.15
    window: 5m
"#;
    let errors: Vec<String> = parse_file(text)
        .unwrap_err()
        .iter()
        .map(ToString::to_string)
        .collect();
    let expect = [
        "receiver \"ops\", field webhook.url: expected an http:// or https:// URL",
        "receivers[1], field name: missing",
        "rules[0], field name: missing",
        "rule \"bad\", field signal: unknown \"local_exceed_rate\"",
        "rule \"bad\", field op: unknown \"=>\"",
        "rule \"bad\", field threshold: missing",
        "rule \"bad\", field window: must be at least 1m",
        "rule \"bad\", field for: expected a duration",
        "rule \"bad\", field labels: \"severity\" is set by budgetscope",
        "rule \"bad\", field labels: \"9x\" is not a label name",
        "rule \"bad\", field annotations: summary: unknown placeholder {{hop}}",
        "rule \"bad\", field receivers: no receiver is named \"pager\"",
        "rule \"slo\", field short_window: must be shorter than window",
        "rule \"slo\", field objective: missing",
        "rule \"hysteresis\", field resolve_threshold: must be on the healthy side of the firing threshold 0.1",
    ];
    for expected in expect {
        assert!(
            errors.iter().any(|e| e.starts_with(expected)),
            "no error starts with {expected:?} in {errors:#?}"
        );
    }
    assert_eq!(errors.len(), expect.len(), "{errors:#?}");
}

#[test]
fn syntax_errors_and_unknown_fields_are_reported_with_their_place() {
    let error = parse_file("rules:\n  - name: x\n    treshold: 1\n").unwrap_err();
    assert!(error[0].problem.contains("treshold"), "{error:?}");
    let error = parse_file("rules: [\n").unwrap_err();
    assert!(
        error[0].problem.starts_with("not a valid rules file"),
        "{error:?}"
    );
    assert_eq!(parse_file("# nothing yet\n").unwrap(), RuleSet::default());
}

#[test]
fn duplicate_names_are_refused() {
    let rule = "  - { name: a, signal: requests, op: \"<\", threshold: 1, window: 1m }\n";
    let errors = parse_file(&format!("rules:\n{rule}{rule}")).unwrap_err();
    assert_eq!(errors.len(), 1);
    assert!(errors[0].to_string().contains("another rule has this name"));
}

#[test]
fn globs_match_whole_names_and_slashes_are_ordinary() {
    let p = NamePattern::parse("GET /orders/*").unwrap();
    assert!(p.matches("GET /orders/42/items"));
    assert!(!p.matches("POST /orders/42"));
    let p = NamePattern::parse("{inventory,billing}").unwrap();
    assert!(p.matches("billing") && !p.matches("billing2"));
    assert_eq!(
        NamePattern::parse("inventory").unwrap().literal(),
        Some("inventory")
    );
    assert!(NamePattern::parse("[").is_err());
}

#[test]
fn templates_fill_known_fields_and_keep_the_rest() {
    let out = render_template(
        "{{service}} {{ operation }}: {{value}} > {{threshold}}",
        &[
            ("service", "a"),
            ("operation", "b"),
            ("value", "0.2"),
            ("threshold", "0.1"),
        ],
    );
    assert_eq!(out, "a b: 0.2 > 0.1");
    assert_eq!(render_template("{{x}} {{", &[]), "{{x}} {{");
}

#[test]
fn the_clear_threshold_is_the_loosest_firing_one_unless_given() {
    let set = parse_file(
        "rules:\n  - { name: a, signal: overspent_ratio, op: \">\", threshold: 0.2, warning: 0.1, window: 5m }\n  - { name: b, signal: overspent_ratio, op: \">\", threshold: 0.2, resolve_threshold: 0.05, window: 5m }\n",
    )
    .unwrap();
    assert_eq!(set.rules[0].clear_threshold(), 0.1);
    assert_eq!(set.rules[1].clear_threshold(), 0.05);
}

#[test]
fn there_is_one_finding_signal_per_advisor_kind() {
    let mut watched: Vec<&str> = Signal::ALL
        .iter()
        .filter_map(|s| s.finding_kind())
        .collect();
    let mut kinds = crate::core::advice::KINDS.to_vec();
    watched.sort_unstable();
    kinds.sort_unstable();
    assert_eq!(watched, kinds);
}
