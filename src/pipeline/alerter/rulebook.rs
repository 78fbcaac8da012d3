//! The rules in force: the rules file's and the stored ones, merged.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use crate::core::alerts::rules::{Rule, RuleError, RuleSet, RuleSource, RuleSpec, validate_rule};
use crate::store::{Store, StoreError};

/// The rules in force: those of the rules file (`--rules`, re-read on SIGHUP) and those
/// created in the UI or the API (stored in the database, re-read every evaluation).
#[derive(Default)]
pub struct RuleBook {
    file: Option<PathBuf>,
    state: RwLock<Books>,
}

#[derive(Default)]
struct Books {
    file: Arc<RuleSet>,
    /// Stored rules, validated against the file's receivers.
    database: Vec<Rule>,
    /// Stored rules that are not in force, with why.
    broken: Vec<(String, Vec<RuleError>)>,
    merged: Arc<RuleSet>,
}

impl Books {
    fn merge(&mut self) {
        let mut merged = (*self.file).clone();
        merged.rules.extend(self.database.iter().cloned());
        self.merged = Arc::new(merged);
    }
}

/// A rules file that could not be used, with every problem in it.
#[derive(Debug, thiserror::Error)]
#[error("{}", describe(.path, .errors))]
pub struct RulesFileError {
    pub path: PathBuf,
    pub errors: Vec<RuleError>,
}

fn describe(path: &std::path::Path, errors: &[RuleError]) -> String {
    let mut text = format!(
        "{}: {} problem{}",
        path.display(),
        errors.len(),
        if errors.len() == 1 { "" } else { "s" }
    );
    for error in errors {
        text.push_str(&format!("\n  {error}"));
    }
    text
}

/// Reads and validates a rules file.
pub fn read_rules_file(path: &std::path::Path) -> Result<RuleSet, RulesFileError> {
    let fail = |problem: String| RulesFileError {
        path: path.to_path_buf(),
        errors: vec![RuleError {
            place: String::new(),
            field: String::new(),
            problem,
        }],
    };
    let text = std::fs::read_to_string(path).map_err(|e| {
        fail(format!(
            "cannot read the file ({e}); check the path given to --rules"
        ))
    })?;
    crate::core::alerts::rules::parse_file(&text).map_err(|errors| RulesFileError {
        path: path.to_path_buf(),
        errors,
    })
}

impl RuleBook {
    /// Loads the rules file, if any; a file with problems fails start-up.
    pub fn load(file: Option<PathBuf>) -> Result<RuleBook, RulesFileError> {
        let set = match &file {
            Some(path) => read_rules_file(path)?,
            None => RuleSet::default(),
        };
        let mut books = Books {
            file: Arc::new(set),
            ..Books::default()
        };
        books.merge();
        Ok(RuleBook {
            file,
            state: RwLock::new(books),
        })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Books> {
        self.state
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Books> {
        self.state
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Every rule in force, the file's first, and the file's receivers.
    pub fn current(&self) -> Arc<RuleSet> {
        self.read().merged.clone()
    }

    /// Stored rules that are not in force, with the problems that keep them out.
    pub fn broken(&self) -> Vec<(String, Vec<RuleError>)> {
        self.read().broken.clone()
    }

    pub fn file(&self) -> Option<&std::path::Path> {
        self.file.as_deref()
    }

    /// Re-reads the rules file. On any problem the rules in force stay as they are.
    pub fn reload(&self) -> Result<usize, RulesFileError> {
        let Some(path) = &self.file else {
            return Ok(0);
        };
        let set = read_rules_file(path)?;
        let count = set.rules.len();
        let mut books = self.write();
        books.file = Arc::new(set);
        books.merge();
        Ok(count)
    }

    /// Validates a rule for the database: the file's receivers, and a name no file rule has.
    pub fn validate_stored(&self, spec: &RuleSpec) -> Result<Rule, Vec<RuleError>> {
        let books = self.read();
        validate_stored(&books.file, spec)
    }

    /// Replaces the stored rules with `specs` ((name, definition JSON), as stored).
    pub fn set_database(&self, specs: &[(String, String)]) {
        let mut books = self.write();
        let (mut rules, mut broken) = (Vec::new(), Vec::new());
        for (name, definition) in specs {
            let parsed = serde_json::from_str::<RuleSpec>(definition).map_err(|e| {
                vec![RuleError {
                    place: format!("rule {name:?}"),
                    field: String::new(),
                    problem: format!("its stored definition cannot be read ({e}); save it again"),
                }]
            });
            match parsed.and_then(|spec| validate_stored(&books.file, &spec)) {
                Ok(rule) => rules.push(rule),
                Err(errors) => broken.push((name.clone(), errors)),
            }
        }
        books.database = rules;
        books.broken = broken;
        books.merge();
    }
}

fn validate_stored(file: &RuleSet, spec: &RuleSpec) -> Result<Rule, Vec<RuleError>> {
    let receivers: BTreeSet<&str> = file.receivers.iter().map(|r| r.name.as_str()).collect();
    let rule = validate_rule(spec, "the rule", RuleSource::Database, &receivers)?;
    if file.rules.iter().any(|r| r.name == rule.name) {
        return Err(vec![RuleError {
            place: format!("rule {:?}", rule.name),
            field: "name".into(),
            problem: "a rule of the rules file has this name; choose another".into(),
        }]);
    }
    Ok(rule)
}

/// Reads the stored rules into `rules`.
pub async fn refresh_stored_rules(store: &dyn Store, rules: &RuleBook) -> Result<(), StoreError> {
    let specs = store.alert_rule_specs().await?;
    rules.set_database(&specs);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reload_takes_a_good_file_and_keeps_the_rules_when_the_new_one_has_problems() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.yaml");
        let rule = |name: &str| {
            format!(
                "  - {{ name: {name}, signal: requests, op: \"<\", threshold: 1, window: 5m }}\n"
            )
        };
        std::fs::write(&path, format!("rules:\n{}", rule("a"))).unwrap();
        let book = RuleBook::load(Some(path.clone())).unwrap();
        assert_eq!(book.current().rules.len(), 1);
        std::fs::write(&path, format!("rules:\n{}{}", rule("a"), rule("b"))).unwrap();
        assert_eq!(book.reload().unwrap(), 2);
        std::fs::write(&path, "rules:\n  - { name: c, window: 5s }\n").unwrap();
        let error = book.reload().unwrap_err().to_string();
        assert!(error.contains("rule \"c\", field window"), "{error}");
        let names: Vec<String> = book
            .current()
            .rules
            .iter()
            .map(|r| r.name.clone())
            .collect();
        assert_eq!(names, ["a", "b"], "the rules in force stay");
        // Stored rules join them, and may not take a file rule's name.
        book.set_database(&[
            (
                "s".into(),
                r#"{"name":"s","signal":"requests","op":"<","threshold":1,"window":"5m"}"#.into(),
            ),
            (
                "a".into(),
                r#"{"name":"a","signal":"requests","op":"<","threshold":1,"window":"5m"}"#.into(),
            ),
            ("bad".into(), "{".into()),
        ]);
        assert_eq!(book.current().rules.len(), 3);
        let broken: Vec<String> = book.broken().iter().map(|(n, _)| n.clone()).collect();
        assert_eq!(broken, ["a", "bad"]);
    }
}
