//! Names the commit the binary is built from, for `--version`: `BUILD_COMMIT` is the short hash of
//! HEAD, with "-dirty" when the work tree has uncommitted changes. An image pipeline building from
//! a tarball (no git) can say it with `LOCALDNS_FALLBACK_COMMIT=...`; otherwise it is "unknown".

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=LOCALDNS_FALLBACK_COMMIT");
    let commit = match std::env::var("LOCALDNS_FALLBACK_COMMIT") {
        Ok(given) if !given.is_empty() => given,
        _ => from_git().unwrap_or_else(|| "unknown".to_owned()),
    };
    println!("cargo:rustc-env=BUILD_COMMIT={commit}");
}

/// The commit of this source tree, or None when it is not a git checkout of its own (a tarball,
/// a .deb source, or a copy unpacked inside some other repository, whose commit would be wrong).
fn from_git() -> Option<String> {
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").ok()?;
    let toplevel = git(&manifest_dir, &["rev-parse", "--show-toplevel"])?;
    if Path::new(&toplevel).canonicalize().ok()? != Path::new(&manifest_dir).canonicalize().ok()? {
        return None;
    }
    // Rebuild when HEAD moves (a checkout or a commit) and when the sources change (dirty or not).
    // --git-path finds the files also in a worktree, whose HEAD is not in ./.git.
    for file in ["HEAD", "packed-refs"] {
        rerun_if_changed(git(&manifest_dir, &["rev-parse", "--git-path", file]));
    }
    if let Some(branch) = git(&manifest_dir, &["symbolic-ref", "-q", "HEAD"]) {
        rerun_if_changed(git(&manifest_dir, &["rev-parse", "--git-path", &branch]));
    }
    for path in ["src", "build.rs", "Cargo.toml", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={path}");
    }

    let hash = git(&manifest_dir, &["rev-parse", "--short", "HEAD"])?;
    let dirty = git(&manifest_dir, &["status", "--porcelain"]).is_none_or(|s| !s.is_empty());
    Some(if dirty { format!("{hash}-dirty") } else { hash })
}

/// A path that does not exist would make cargo rerun this script on every build: skip those
/// (packed-refs, or a branch with no loose ref file).
fn rerun_if_changed(path: Option<String>) {
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    if let Some(path) = path.filter(|p| Path::new(&manifest_dir).join(p).exists()) {
        println!("cargo:rerun-if-changed={path}");
    }
}

/// Runs git in `dir`; its trimmed output, or None if git is missing or fails.
fn git(dir: &str, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    Some(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}
