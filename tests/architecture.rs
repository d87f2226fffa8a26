//! The module graph of `src/`, read from the source: which top-level module refers to which
//! (`crate::<module>` outside comments and test modules). It must have no cycle, config must
//! be a leaf, and the core must not know its transports. A newcomer reading one module then
//! never has to hold its caller in mind too.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top-level module of a file under `src/` (`src/secrets/plan.rs` -> `secrets`); `None` for the
/// crate roots, which declare every module.
fn module_of(rel: &Path) -> Option<String> {
    let first = rel.components().next()?.as_os_str().to_str()?.to_owned();
    let name = first.trim_end_matches(".rs").to_owned();
    (!matches!(name.as_str(), "lib" | "main")).then_some(name)
}

/// The source without comments and without the `#[cfg(test)]` modules at the end of a file.
fn code_of(text: &str) -> String {
    let body = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    let body = match body.find("#[cfg(test)]\npub(crate) mod testing") {
        Some(i) => &body[..i],
        None => body,
    };
    body.lines()
        .map(|line| match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// module -> the other top-level modules it refers to.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = common::root().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut modules = BTreeSet::new();
    for f in &files {
        if let Some(m) = module_of(f.strip_prefix(&src).unwrap()) {
            modules.insert(m);
        }
    }
    let mut graph: BTreeMap<String, BTreeSet<String>> = modules
        .iter()
        .map(|m| (m.clone(), BTreeSet::new()))
        .collect();
    for f in &files {
        let Some(from) = module_of(f.strip_prefix(&src).unwrap()) else {
            continue;
        };
        let code = code_of(&std::fs::read_to_string(f).unwrap());
        for (i, _) in code.match_indices("crate::") {
            let rest = &code[i + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if name != from && modules.contains(&name) {
                graph.get_mut(&from).unwrap().insert(name);
            }
        }
    }
    graph
}

/// A cycle through `graph`, if there is one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == node) {
            let mut cycle = path[i..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in &graph[node] {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        if let Some(c) = visit(node, graph, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

#[test]
fn the_module_graph_has_no_cycle() {
    let graph = graph();
    assert!(graph.len() >= 10, "too few modules found: {graph:?}");
    if let Some(cycle) = find_cycle(&graph) {
        panic!("import cycle: {}\n{graph:#?}", cycle.join(" -> "));
    }
}

#[test]
fn config_imports_no_feature() {
    let graph = graph();
    // Name and reference rules: leaves themselves, shared by config and the features.
    let allowed: BTreeSet<String> = ["k8s_names".to_owned(), "image_ref".to_owned()].into();
    for rule in &allowed {
        assert!(graph[rule].is_empty(), "{rule} refers to {:?}", graph[rule]);
    }
    assert!(
        graph["config"].is_subset(&allowed),
        "config refers to {:?}",
        graph["config"]
    );
}

#[test]
fn the_core_never_sees_its_transports() {
    let graph = graph();
    for core in [
        "admission",
        "app",
        "mutate",
        "secrets",
        "config",
        "metrics",
        "patch",
    ] {
        assert!(
            !graph[core].contains("transport") && !graph[core].contains("cli"),
            "{core} refers to {:?}",
            graph[core]
        );
    }
}

#[test]
fn the_checker_sees_a_cycle_when_there_is_one() {
    let mut graph = graph();
    graph
        .get_mut("config")
        .unwrap()
        .insert("secrets".to_owned());
    let cycle = find_cycle(&graph).expect("config -> secrets -> config is a cycle");
    assert!(cycle.contains(&"config".to_owned()), "{cycle:?}");
}
