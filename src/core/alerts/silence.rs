//! Silences: label matchers and a time range; while one is active, the instances whose
//! labels match all its matchers send no notifications. Pure.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use super::rules::NamePattern;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum MatchOp {
    /// `=`: the label equals the value (a missing label is the empty string).
    Eq,
    /// `!=`
    Ne,
    /// `=~`: the label matches the glob (`*`, `?`, `[abc]`, `{a,b}`).
    Glob,
    /// `!~`
    NotGlob,
}

impl MatchOp {
    pub fn as_str(self) -> &'static str {
        match self {
            MatchOp::Eq => "=",
            MatchOp::Ne => "!=",
            MatchOp::Glob => "=~",
            MatchOp::NotGlob => "!~",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Matcher {
    pub name: String,
    pub op: MatchOp,
    pub value: String,
    pattern: Option<NamePattern>,
}

impl fmt::Display for Matcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}{}", self.name, self.op.as_str(), self.value)
    }
}

impl Serialize for Matcher {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl Matcher {
    /// Reads `name=value`, `name!=value`, `name=~glob` or `name!~glob`.
    pub fn parse(text: &str) -> Result<Matcher, String> {
        let text = text.trim();
        let (at, op, len) = [
            ("!=", MatchOp::Ne),
            ("=~", MatchOp::Glob),
            ("!~", MatchOp::NotGlob),
            ("=", MatchOp::Eq),
        ]
        .into_iter()
        .filter_map(|(sym, op)| text.find(sym).map(|at| (at, op, sym.len())))
        .min_by_key(|(at, op, _)| (*at, *op == MatchOp::Eq))
        .ok_or_else(|| {
            format!("{text:?}: expected label=value, label!=value, label=~glob or label!~glob")
        })?;
        let name = text[..at].trim();
        let value = text[at + len..].trim().trim_matches('"');
        let valid_name = name
            .chars()
            .enumerate()
            .all(|(i, c)| c.is_ascii_alphabetic() || c == '_' || (i > 0 && c.is_ascii_digit()));
        if name.is_empty() || !valid_name {
            return Err(format!("{text:?}: {name:?} is not a label name"));
        }
        let pattern = match op {
            MatchOp::Glob | MatchOp::NotGlob => {
                Some(NamePattern::parse(value).map_err(|e| format!("{text:?}: {e}"))?)
            }
            MatchOp::Eq | MatchOp::Ne => None,
        };
        Ok(Matcher {
            name: name.to_string(),
            op,
            value: value.to_string(),
            pattern,
        })
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let actual = labels.get(&self.name).map_or("", String::as_str);
        let glob = || self.pattern.as_ref().is_some_and(|p| p.matches(actual));
        match self.op {
            MatchOp::Eq => actual == self.value,
            MatchOp::Ne => actual != self.value,
            MatchOp::Glob => glob(),
            MatchOp::NotGlob => !glob(),
        }
    }
}

/// Matchers separated by commas or new lines, e.g. `service=inventory, severity!=warning`.
pub fn parse_matchers(text: &str) -> Result<Vec<Matcher>, String> {
    let matchers = text
        .split([',', '\n'])
        .filter(|part| !part.trim().is_empty())
        .map(Matcher::parse)
        .collect::<Result<Vec<_>, _>>()?;
    if matchers.is_empty() {
        return Err("give at least one matcher, e.g. service=inventory".into());
    }
    Ok(matchers)
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Silence {
    /// Assigned by the store; 0 before it is stored.
    pub id: i64,
    pub matchers: Vec<Matcher>,
    pub starts_unix_nano: u64,
    pub ends_unix_nano: u64,
    pub comment: String,
    pub created_by: String,
    pub created_unix_nano: u64,
}

impl Silence {
    /// `pending` before it starts, `active`, then `expired`.
    pub fn status(&self, now: u64) -> &'static str {
        if now < self.starts_unix_nano {
            "pending"
        } else if now < self.ends_unix_nano {
            "active"
        } else {
            "expired"
        }
    }

    pub fn silences(&self, labels: &BTreeMap<String, String>, now: u64) -> bool {
        self.status(now) == "active" && self.matchers.iter().all(|m| m.matches(labels))
    }
}

/// The first active silence that matches `labels`.
pub fn silenced_by(
    silences: &[Silence],
    labels: &BTreeMap<String, String>,
    now: u64,
) -> Option<i64> {
    silences
        .iter()
        .find(|s| s.silences(labels, now))
        .map(|s| s.id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn matchers_parse_and_match_as_written() {
        let matchers =
            parse_matchers("service=inventory, severity!=warning\noperation=~GET *").unwrap();
        assert_eq!(
            matchers.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["service=inventory", "severity!=warning", "operation=~GET *"]
        );
        let hit = labels(&[
            ("service", "inventory"),
            ("severity", "critical"),
            ("operation", "GET /items"),
        ]);
        assert!(matchers.iter().all(|m| m.matches(&hit)));
        let miss = labels(&[
            ("service", "inventory"),
            ("severity", "warning"),
            ("operation", "GET /items"),
        ]);
        assert!(!matchers.iter().all(|m| m.matches(&miss)));
        assert!(Matcher::parse("team!~web*").unwrap().matches(&labels(&[])));
        for bad in ["inventory", "=x", "9a=b", "a=~["] {
            assert!(Matcher::parse(bad).is_err(), "{bad}");
        }
        assert!(parse_matchers(" , ").is_err());
    }

    #[test]
    fn a_silence_applies_only_while_active() {
        let silence = Silence {
            id: 3,
            matchers: parse_matchers("service=inventory").unwrap(),
            starts_unix_nano: 100,
            ends_unix_nano: 200,
            comment: "deploy".into(),
            created_by: "ana".into(),
            created_unix_nano: 90,
        };
        let l = labels(&[("service", "inventory")]);
        let all = [silence.clone()];
        assert_eq!(silenced_by(&all, &l, 99), None);
        assert_eq!(silenced_by(&all, &l, 150), Some(3));
        assert_eq!(silenced_by(&all, &l, 200), None);
        assert_eq!(silence.status(250), "expired");
        assert_eq!(
            silenced_by(&all, &labels(&[("service", "billing")]), 150),
            None
        );
    }
}
