//! The modules of each crate (`core/src/`, `src/`) import one another one way only: no two of
//! them, directly or through others, depend on each other. Read off the source text
//! (`crate::name` mentions outside comments), so a new cycle fails here before a reviewer has to
//! spot it. That the core reads no clock and owns no socket is held by the compiler (its
//! Cargo.toml) and by clippy (`core/clippy.toml`); the last test keeps its Cargo.toml honest.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top-level module of the crate whose sources are in `dir` → the top-level modules its files
/// mention as `crate::other`.
fn graph_of(dir: &str) -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("src/lib.rs");
    let modules: Vec<String> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("pub mod "))
        .map(|m| m.trim_end_matches(';').to_string())
        .collect();
    let mut graph = BTreeMap::new();
    for m in &modules {
        let mut files = Vec::new();
        let file = src.join(format!("{m}.rs"));
        if file.exists() {
            files.push(file);
        }
        let mut dirs = vec![src.join(m)];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = entry.path();
                // A module's unit tests (`tests/`, `tests.rs`) may use a test harness built on
                // the module itself, such as core's engine rig: a test-only edge, not a cycle.
                if path.file_stem().is_some_and(|n| n == "tests") {
                    continue;
                }
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    files.push(path);
                }
            }
        }
        let mut uses = BTreeSet::new();
        for f in files {
            let full = std::fs::read_to_string(&f).expect("a source file");
            // Doc links name modules without importing them.
            let text: String = full
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            for (at, _) in text.match_indices("crate::") {
                let name: String = text[at + 7..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if modules.contains(&name) && name != *m {
                    uses.insert(name);
                }
            }
        }
        graph.insert(m.clone(), uses);
    }
    graph
}

/// Both crates' graphs; a core module and a daemon module never share a name.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut graph = graph_of("core/src");
    let daemon = graph_of("src");
    for m in daemon.keys() {
        assert!(!graph.contains_key(m), "{m} is a module of both crates");
    }
    graph.extend(daemon);
    graph
}

#[test]
fn no_module_of_src_depends_on_itself_through_others() {
    let graph = graph();
    assert!(
        graph.len() > 15,
        "modules read off lib.rs: {:?}",
        graph.keys()
    );
    // Depth-first search for a back edge.
    fn visit(
        m: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) {
        if done.contains(m) {
            return;
        }
        if let Some(at) = path.iter().position(|p| p == m) {
            panic!("import cycle: {} -> {m}", path[at..].join(" -> "));
        }
        path.push(m.to_string());
        for next in &graph[m] {
            visit(next, graph, path, done);
        }
        path.pop();
        done.insert(m.to_string());
    }
    let mut done = BTreeSet::new();
    for m in graph.keys() {
        visit(m, &graph, &mut Vec::new(), &mut done);
    }
}

#[test]
fn the_core_crate_depends_on_no_runtime_socket_or_log_crate() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("core/Cargo.toml");
    let text = std::fs::read_to_string(&manifest).expect("core/Cargo.toml");
    let deps: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("[dependencies]"))
        .skip(1)
        .take_while(|l| !l.starts_with('['))
        .filter_map(|l| l.split('=').next().map(str::trim))
        .filter(|name| !name.is_empty() && !name.starts_with('#'))
        .collect();
    assert!(
        deps.contains(&"lru"),
        "dependencies read off core/Cargo.toml: {deps:?}"
    );
    for banned in ["tokio", "nix", "socket2", "tracing", "libc"] {
        assert!(
            !deps.contains(&banned),
            "core depends on {banned}: {deps:?}"
        );
    }
}
