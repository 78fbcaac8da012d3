//! Architecture invariant of `src/analyze/`: the analysis core is pure. It names no
//! database, web, RPC or async-runtime crate, so it cannot do IO or block an executor.

use std::path::Path;

#[test]
fn the_analysis_core_imports_no_io_crates() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/analyze");
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
                    "{}:{}: the analysis core must stay pure but names `{forbidden}`: {line}",
                    path.display(),
                    number + 1
                );
            }
        }
        checked += 1;
    }
    assert!(
        checked >= 5,
        "expected the analysis sources in {}",
        dir.display()
    );
}
