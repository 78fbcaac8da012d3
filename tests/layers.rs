//! Architecture invariants of `src/`'s layers (ARCHITECTURE.md):
//! - `src/core/` is pure: it names no database, web, RPC, async-runtime, file, network or
//!   clock item, so it cannot do IO or block an executor;
//! - data flows one way: each layer imports only the layers declared before it in
//!   `src/lib.rs` (`clock`, `core`, `otlp`, `store`, `pipeline`, `web`, `server`, `cli`), so
//!   there is no cycle between folders.

use std::path::{Path, PathBuf};

/// The layers in flow order, as `src/lib.rs` declares them.
const LAYERS: [&str; 8] = [
    "clock", "core", "otlp", "store", "pipeline", "web", "server", "cli",
];

/// Names a pure module may not use.
const IMPURE: [&str; 9] = [
    "sqlx",
    "axum",
    "tonic",
    "tokio",
    "reqwest",
    "std::fs",
    "std::net",
    "SystemTime",
    "Instant",
];

#[test]
fn the_core_is_pure() {
    let files = sources(&src().join("core"));
    assert!(files.len() >= 15, "expected the core's sources");
    for (path, source) in &files {
        for (number, code) in code_lines(source) {
            for forbidden in IMPURE.iter().chain(&["crate::clock"]) {
                assert!(
                    !code.contains(forbidden),
                    "{}:{number}: src/core must stay pure but names `{forbidden}`: {code}",
                    path.display(),
                );
            }
        }
    }
}

#[test]
fn src_holds_only_the_layers_lib_rs_declares() {
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    let declared: Vec<&str> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("pub mod "))
        .map(|l| l.trim_end_matches(';'))
        .collect();
    assert_eq!(
        declared, LAYERS,
        "src/lib.rs declares the layers in flow order"
    );
    let mut entries: Vec<String> = std::fs::read_dir(src())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    entries.sort();
    let mut expected: Vec<String> = LAYERS
        .iter()
        .map(|l| match *l {
            "clock" => "clock.rs".to_string(),
            layer => layer.to_string(),
        })
        .chain(["lib.rs".to_string(), "main.rs".to_string()])
        .collect();
    expected.sort();
    assert_eq!(
        entries, expected,
        "src/ holds the layers, lib.rs and main.rs"
    );
}

#[test]
fn each_layer_imports_only_the_layers_before_it() {
    let mut checked = 0;
    let mut wrong = Vec::new();
    for (index, layer) in LAYERS.iter().enumerate() {
        let root = src().join(layer);
        let files = if root.is_dir() {
            sources(&root)
        } else {
            sources_of(&src().join(format!("{layer}.rs")))
        };
        for (path, source) in &files {
            for (number, code) in code_lines(source) {
                for used in crate_paths(code) {
                    match LAYERS.iter().position(|l| *l == used) {
                        Some(position) if position <= index => {}
                        Some(_) => wrong.push(format!(
                            "{}:{number}: layer `{layer}` imports `{used}`, which comes after \
                             it in the flow: {}",
                            path.display(),
                            code.trim()
                        )),
                        None => wrong.push(format!(
                            "{}:{number}: `crate::{used}` is not a layer of src/lib.rs: {}",
                            path.display(),
                            code.trim()
                        )),
                    }
                }
            }
            checked += 1;
        }
    }
    assert!(checked >= 80, "expected every source file, found {checked}");
    assert!(
        wrong.is_empty(),
        "imports against the flow:\n{}",
        wrong.join("\n")
    );
}

/// The first path segment after each `crate::` in a line of code.
fn crate_paths(code: &str) -> Vec<&str> {
    code.match_indices("crate::")
        .filter(|(at, _)| {
            // `$crate::` (macros) and identifiers ending in `crate` are not our crate.
            !code[..*at].ends_with(|c: char| c == '$' || c == '_' || c.is_alphanumeric())
        })
        .map(|(at, m)| {
            let rest = &code[at + m.len()..];
            let end = rest
                .find(|c: char| !(c == '_' || c.is_alphanumeric()))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .collect()
}

/// Lines of code with their numbers, comments cut off.
fn code_lines(source: &str) -> impl Iterator<Item = (usize, &str)> {
    source
        .lines()
        .enumerate()
        .map(|(i, line)| (i + 1, line.split("//").next().unwrap_or("")))
        .filter(|(_, code)| !code.trim().is_empty())
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`, with its text.
fn sources(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(sources(&path));
        } else {
            files.extend(sources_of(&path));
        }
    }
    files
}

fn sources_of(path: &Path) -> Vec<(PathBuf, String)> {
    match path.extension() {
        Some(e) if e == "rs" => vec![(path.to_path_buf(), std::fs::read_to_string(path).unwrap())],
        _ => Vec::new(),
    }
}
