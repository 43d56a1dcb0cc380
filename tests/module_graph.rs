//! The modules of each crate (`core/src/`, `src/`) import one another one way only: no two of
//! them, directly or through others, depend on each other; nor do the files of one module
//! directory (`src/listen/bind.rs` and `steer.rs`, ...). Read off the source text (`crate::name`,
//! `super::name` mentions outside comments), so a new cycle fails here before a reviewer has to
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
    if let Some(cycle) = cycle(&graph) {
        panic!("import cycle: {cycle}");
    }
}

/// A cycle in `graph`, as `a -> b -> a`, if there is one (depth-first search for a back edge).
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<String> {
    fn visit(
        m: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<String> {
        if done.contains(m) {
            return None;
        }
        if let Some(at) = path.iter().position(|p| p == m) {
            return Some(format!("{} -> {m}", path[at..].join(" -> ")));
        }
        path.push(m.to_string());
        for next in graph.get(m).into_iter().flatten() {
            if let Some(found) = visit(next, graph, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(m.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|m| visit(m, graph, &mut Vec::new(), &mut done))
}

/// Source text without comment lines (doc links name items without importing them).
fn code_of(file: &Path) -> String {
    let full = std::fs::read_to_string(file).expect("a source file");
    full.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first path segment of each name `prefix` introduces in `text`: `super::a::B` gives `a`,
/// `super::{a, b::C}` gives `a` and `b`.
fn named_after(text: &str, prefix: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = Vec::new();
    for (at, _) in text.match_indices(prefix) {
        let rest = &text[at + prefix.len()..];
        let Some(group) = rest.strip_prefix('{') else {
            out.push(ident(rest));
            continue;
        };
        // Items of the group at its top level, split on commas outside nested braces.
        let (mut depth, mut item) = (0, String::new());
        for c in group.chars() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    out.push(ident(&item));
                    item.clear();
                    continue;
                }
                _ => {}
            }
            item.push(c);
        }
        out.push(ident(&item));
    }
    out.retain(|n| !n.is_empty());
    out
}

/// For each module directory under `dir` (`src/listen/`, `core/src/engine/`, ...): the graph of
/// its files (`bind` → the sibling files it mentions as `super::steer`, `crate::listen::steer`,
/// or by an item the module's own file imports from that sibling). A module's unit tests are
/// left out, as above.
fn sibling_graphs(dir: &str) -> Vec<(String, BTreeMap<String, BTreeSet<String>>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut graphs = Vec::new();
    let mut dirs = vec![root.clone()];
    while let Some(d) = dirs.pop() {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.file_stem().is_some_and(|n| n == "tests") {
                continue;
            }
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
        if d == root {
            continue;
        }
        let stem = |p: &Path| p.file_stem().unwrap().to_string_lossy().into_owned();
        let siblings: Vec<String> = files
            .iter()
            .map(|f| stem(f))
            .filter(|s| s != "mod")
            .collect();
        // The module's own file: `dir/mod.rs`, or `dir.rs` beside the directory.
        let own = [d.join("mod.rs"), d.with_extension("rs")]
            .into_iter()
            .find(|f| f.exists())
            .expect("a module directory has a mod.rs or a file of its name");
        // Items the module's own file takes from a sibling (`pub use steer::Held;`).
        let mut item_of = BTreeMap::new();
        let own_text = code_of(&own);
        for line in own_text.split(';') {
            let Some(at) = line.find("use ") else {
                continue;
            };
            let path = line[at + 4..].trim();
            let Some((first, rest)) = path.split_once("::") else {
                continue;
            };
            if siblings.iter().any(|s| s == first) {
                for item in rest
                    .trim_matches(|c| c == '{' || c == '}')
                    .split(',')
                    .map(|i| i.trim().rsplit("::").next().unwrap_or("").to_string())
                {
                    item_of.insert(item, first.to_string());
                }
            }
        }
        let module = d
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .replace('/', "::");
        let mut graph = BTreeMap::new();
        for f in files.iter().filter(|f| stem(f) != "mod") {
            let text = code_of(f);
            let mut mentioned = named_after(&text, "super::");
            mentioned.extend(named_after(&text, &format!("crate::{module}::")));
            let uses: BTreeSet<String> = mentioned
                .into_iter()
                .filter_map(|n| match item_of.get(&n) {
                    Some(sibling) => Some(sibling.clone()),
                    None => siblings.contains(&n).then_some(n),
                })
                .filter(|n| *n != stem(f))
                .collect();
            graph.insert(stem(f), uses);
        }
        graphs.push((
            d.strip_prefix(Path::new(env!("CARGO_MANIFEST_DIR")))
                .unwrap()
                .display()
                .to_string(),
            graph,
        ));
    }
    graphs
}

#[test]
fn no_file_of_a_module_directory_depends_on_itself_through_its_siblings() {
    let graphs: Vec<_> = sibling_graphs("src")
        .into_iter()
        .chain(sibling_graphs("core/src"))
        .collect();
    let names: Vec<&str> = graphs.iter().map(|(d, _)| d.as_str()).collect();
    for expected in ["src/listen", "src/server", "src/relay", "core/src/engine"] {
        assert!(
            names.contains(&expected),
            "module directories found: {names:?}"
        );
    }
    // The reading itself: bind.rs mentions steer, and serve.rs listener.
    let edges =
        |dir: &str, file: &str| graphs.iter().find(|(d, _)| d == dir).unwrap().1[file].clone();
    assert!(
        edges("src/server", "serve").contains("listener"),
        "{graphs:?}"
    );
    let cycles: Vec<String> = graphs
        .iter()
        .filter_map(|(d, g)| cycle(g).map(|c| format!("{d}: {c}")))
        .collect();
    assert!(
        cycles.is_empty(),
        "import cycles between sibling files: {cycles:#?}"
    );
}

#[test]
fn names_after_a_prefix_include_each_item_of_a_group() {
    let text =
        "use super::{bind::Bound, steer::{Held, Place}, tool};\nlet x = super::super::leases::f();";
    assert_eq!(
        named_after(text, "super::"),
        ["bind", "steer", "tool", "super", "leases"]
    );
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
