//! Build script: records the commit the binary is built from, for
//! `fencecron --version` and `fencecron_build_info`.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    Command::new("git")
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

fn main() {
    // A build from a git checkout names its commit; one from a source
    // tarball says `unknown`.
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=FENCECRON_COMMIT={commit}");
    // Run again when HEAD moves: a commit rewrites the index, a checkout HEAD
    // (also in a worktree, whose git directory is elsewhere).
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        println!("cargo:rerun-if-changed={dir}/HEAD");
        println!("cargo:rerun-if-changed={dir}/index");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
