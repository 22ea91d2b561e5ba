//! The layering rules ARCHITECTURE.md states, checked on the source text:
//! a rule that only a reviewer keeps is soon untrue.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `src/<dir>`, with its text up to its first
/// `#[cfg(test)]` (a file's own tests may use what its code must not).
fn code_of(dir: &str) -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("read the source directory") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(dir);
    let mut files = Vec::new();
    walk(&root, &mut files);
    assert!(!files.is_empty(), "no source under {}", root.display());
    files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("read a source file");
            let code = match text.find("#[cfg(test)]") {
                Some(at) => text[..at].to_string(),
                None => text,
            };
            (path, code)
        })
        .collect()
}

fn offenders(dir: &str, skip: &str, forbidden: &[&str]) -> Vec<String> {
    code_of(dir)
        .into_iter()
        .filter(|(path, _)| !path.components().any(|c| c.as_os_str() == skip))
        .flat_map(|(path, code)| {
            forbidden
                .iter()
                .filter(|f| code.contains(*f))
                .map(|f| format!("{} uses {f}", path.display()))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The store is a leaf: it reports what it noticed to its caller (its
/// `StoreHook`) and never reaches up into logging, metrics, the CLI or
/// the daemon. Its conformance suite (`cfg(test)`) is exempt.
#[test]
fn store_is_a_leaf() {
    let found = offenders(
        "store",
        "conformance",
        &[
            "crate::events",
            "crate::metrics",
            "crate::cli",
            "crate::commands",
            "crate::daemon",
            "crate::supervise",
            "crate::logging",
        ],
    );
    assert!(found.is_empty(), "the store must stay a leaf: {found:#?}");
}

/// The daemon reads wall time only through `clock::Clock`, so that tests
/// on tokio's paused clock drive instants and give-up times too.
#[test]
fn daemon_reads_time_only_through_clock() {
    let found = offenders(
        "daemon",
        "tests",
        &["Utc::now", "SystemTime::now", "Local::now"],
    );
    assert!(found.is_empty(), "read time through Clock: {found:#?}");
}
