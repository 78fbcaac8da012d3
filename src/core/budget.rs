//! Reading the remaining deadline budget from a span's attributes.
//!
//! Architecture invariant: pure functions over `model` types; a value that does not parse
//! becomes a warning, never an error, so a span is never rejected because of its budget.

use crate::core::model::{AttrValue, Attributes, Budget, attr};

/// The attribute keys consulted, in order, when none are configured
/// (docs/budget-semantics.md, "Where the budget is read from").
pub const DEFAULT_BUDGET_KEYS: &[&str] = &[
    "deadline.remaining_ms",
    "http.request.header.x-request-budget-ms",
    "http.request.header.x-budget-remaining-ms",
    "http.request.header.x-deadline-ms",
    "http.request.header.x-request-timeout-ms",
    "http.request.header.x-envoy-expected-rq-timeout-ms",
    "rpc.grpc.request.metadata.grpc-timeout",
];

/// The outcome of looking for a budget on one span.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BudgetReading {
    pub budget: Option<Budget>,
    /// One warning per present key whose value did not parse.
    pub warnings: Vec<String>,
}

/// Reads the budget from the first key in `keys` that is present and parses.
///
/// Keys ending in `grpc-timeout` are read in gRPC's wire format (`850m`); all others as
/// milliseconds (an int, a finite double or a numeric string). Header captures are string
/// arrays: their first element is used.
pub fn read_budget(attributes: &Attributes, keys: &[String]) -> BudgetReading {
    let mut reading = BudgetReading::default();
    for key in keys {
        let Some(value) = attr(attributes, key) else {
            continue;
        };
        let parsed = if key.ends_with("grpc-timeout") {
            first_string(value).and_then(parse_grpc_timeout)
        } else {
            parse_millis(value)
        };
        match parsed {
            Some(ms) => {
                reading.budget = Some(Budget {
                    ms,
                    source: key.clone(),
                });
                return reading;
            }
            None => reading.warnings.push(format!(
                "budget attribute {key} has unparsable value {}",
                describe(value)
            )),
        }
    }
    reading
}

fn first_element(value: &AttrValue) -> &AttrValue {
    match value {
        AttrValue::Array(items) => items.first().unwrap_or(&AttrValue::Empty),
        other => other,
    }
}

fn first_string(value: &AttrValue) -> Option<&str> {
    match first_element(value) {
        AttrValue::String(s) => Some(s.as_str()),
        _ => None,
    }
}

fn parse_millis(value: &AttrValue) -> Option<f64> {
    let ms = match first_element(value) {
        AttrValue::Int(i) => *i as f64,
        AttrValue::Double(d) => *d,
        AttrValue::String(s) => s.trim().parse::<f64>().ok()?,
        _ => return None,
    };
    ms.is_finite().then_some(ms)
}

/// Parses gRPC's `grpc-timeout` header: at most 8 ASCII digits and one unit letter.
pub fn parse_grpc_timeout(text: &str) -> Option<f64> {
    let text = text.trim();
    let unit = text.chars().last()?;
    let digits = &text[..text.len() - unit.len_utf8()];
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: f64 = digits.parse::<u32>().ok()?.into();
    let ms_per_unit = match unit {
        'H' => 3_600_000.0,
        'M' => 60_000.0,
        'S' => 1_000.0,
        'm' => 1.0,
        'u' => 1e-3,
        'n' => 1e-6,
        _ => return None,
    };
    Some(n * ms_per_unit)
}

fn describe(value: &AttrValue) -> String {
    let text = match value {
        AttrValue::Empty => "(empty)".to_string(),
        AttrValue::String(s) => format!("{s:?}"),
        AttrValue::Bool(b) => b.to_string(),
        AttrValue::Int(i) => i.to_string(),
        AttrValue::Double(d) => d.to_string(),
        AttrValue::Bytes(b) => format!("({} bytes)", b.len()),
        AttrValue::Array(items) => format!("(array of {})", items.len()),
        AttrValue::Map(items) => format!("(map of {})", items.len()),
    };
    text.chars().take(80).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Vec<String> {
        DEFAULT_BUDGET_KEYS.iter().map(|k| k.to_string()).collect()
    }

    fn read(attrs: Vec<(&str, AttrValue)>) -> BudgetReading {
        let attrs = attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        read_budget(&attrs, &keys())
    }

    fn s(text: &str) -> AttrValue {
        AttrValue::String(text.to_string())
    }

    #[test]
    fn deadline_remaining_ms_accepts_int_double_and_numeric_string() {
        for (value, expected) in [
            (AttrValue::Int(840), 840.0),
            (AttrValue::Double(12.5), 12.5),
            (s(" -100 "), -100.0),
            (s("1e3"), 1000.0),
        ] {
            let reading = read(vec![("deadline.remaining_ms", value)]);
            let budget = reading.budget.expect("budget");
            assert_eq!(budget.ms, expected);
            assert_eq!(budget.source, "deadline.remaining_ms");
            assert!(reading.warnings.is_empty());
        }
    }

    #[test]
    fn header_capture_arrays_use_their_first_element() {
        let reading = read(vec![(
            "http.request.header.x-request-budget-ms",
            AttrValue::Array(vec![s("310"), s("999")]),
        )]);
        assert_eq!(reading.budget.unwrap().ms, 310.0);
    }

    #[test]
    fn grpc_timeout_units() {
        assert_eq!(parse_grpc_timeout("850m"), Some(850.0));
        assert_eq!(parse_grpc_timeout("2S"), Some(2000.0));
        assert_eq!(parse_grpc_timeout("1M"), Some(60_000.0));
        assert_eq!(parse_grpc_timeout("1H"), Some(3_600_000.0));
        assert_eq!(parse_grpc_timeout("1500u"), Some(1.5));
        assert_eq!(parse_grpc_timeout("99999999n"), Some(99999999.0 * 1e-6));
        assert_eq!(parse_grpc_timeout("123456789m"), None, "more than 8 digits");
        assert_eq!(parse_grpc_timeout("850"), None, "no unit");
        assert_eq!(parse_grpc_timeout("m"), None, "no digits");
        assert_eq!(parse_grpc_timeout("85x"), None, "unknown unit");
        assert_eq!(parse_grpc_timeout("-5m"), None, "sign is not a digit");
        assert_eq!(parse_grpc_timeout("5µ"), None, "multi-byte unit");
    }

    #[test]
    fn unparsable_value_warns_and_falls_through_to_the_next_key() {
        let reading = read(vec![
            ("deadline.remaining_ms", s("soon")),
            (
                "rpc.grpc.request.metadata.grpc-timeout",
                AttrValue::Array(vec![s("850m")]),
            ),
        ]);
        let budget = reading.budget.unwrap();
        assert_eq!(budget.ms, 850.0);
        assert_eq!(budget.source, "rpc.grpc.request.metadata.grpc-timeout");
        assert_eq!(
            reading.warnings,
            ["budget attribute deadline.remaining_ms has unparsable value \"soon\""]
        );
    }

    #[test]
    fn non_finite_and_non_numeric_values_are_not_budgets() {
        for value in [
            AttrValue::Double(f64::NAN),
            AttrValue::Bool(true),
            s("inf"),
            AttrValue::Array(vec![]),
        ] {
            let reading = read(vec![("deadline.remaining_ms", value)]);
            assert_eq!(reading.budget, None);
            assert_eq!(reading.warnings.len(), 1);
        }
    }

    #[test]
    fn no_budget_keys_means_no_budget_and_no_warning() {
        assert_eq!(
            read(vec![("http.method", s("GET"))]),
            BudgetReading::default()
        );
    }
}
