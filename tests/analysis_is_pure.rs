//! Architecture invariant of `src/analyze/` and `src/alerts/`: the analysis core and the
//! alert evaluation are pure. They name no database, web, RPC or async-runtime crate, so
//! they cannot do IO or block an executor.

use std::path::Path;

#[test]
fn the_analysis_core_imports_no_io_crates() {
    check_pure("src/analyze", 5);
}

#[test]
fn the_alert_evaluation_imports_no_io_crates() {
    check_pure("src/alerts", 3);
}

fn check_pure(folder: &str, at_least: usize) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(folder);
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let source = std::fs::read_to_string(&path).unwrap();
        for (number, line) in source.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for forbidden in [
                "sqlx",
                "axum",
                "tonic",
                "tokio",
                "reqwest",
                "std::fs",
                "std::net",
                "SystemTime",
                "Instant",
            ] {
                assert!(
                    !code.contains(forbidden),
                    "{}:{}: this module must stay pure but names `{forbidden}`: {line}",
                    path.display(),
                    number + 1
                );
            }
        }
        checked += 1;
    }
    assert!(
        checked >= at_least,
        "expected the pure sources in {}",
        dir.display()
    );
}
