//! The workspace's layers. Between crates the compiler holds them: the core crate
//! (`crates/core`) cannot name the AWS crate or the transports, and `cargo tree` shows it links
//! no network crate. Within a crate, the module graph read from the source (which top-level
//! module refers to which, `crate::<module>` outside comments and test modules) must have no
//! cycle, and config must be a leaf. A newcomer reading one module then never has to hold its
//! caller in mind too.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top-level module of a file under a crate's `src/` (`secrets/plan.rs` -> `secrets`); `None`
/// for the crate roots, which declare every module.
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

/// The crates whose module graphs are checked, by their `src/` directory.
const CRATE_SOURCES: [&str; 3] = ["src", "crates/core/src", "crates/aws/src"];

/// module -> the other top-level modules it refers to, in the core crate.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    graph_of("crates/core/src")
}

/// module -> the other top-level modules of the same crate it refers to.
fn graph_of(dir: &str) -> BTreeMap<String, BTreeSet<String>> {
    let src = common::root().join(dir);
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
    assert!(graph().len() >= 10, "too few modules found: {:?}", graph());
    for dir in CRATE_SOURCES {
        let graph = graph_of(dir);
        assert!(
            graph.len() >= 3,
            "too few modules found in {dir}: {graph:?}"
        );
        if let Some(cycle) = find_cycle(&graph) {
            panic!("import cycle in {dir}: {}\n{graph:#?}", cycle.join(" -> "));
        }
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

/// Crates of a network stack: HTTP, TLS, the AWS SDK and the Lambda runtime.
fn is_network_crate(name: &str) -> bool {
    [
        "hyper",
        "h2",
        "rustls",
        "tokio-rustls",
        "aws-",
        "lambda_",
        "reqwest",
        "mio",
    ]
    .iter()
    .any(|p| name == p.trim_end_matches('-') || name.starts_with(p))
}

/// The packages `cargo tree` lists for `package`'s normal (non-dev, non-build) dependencies.
fn normal_dependencies(package: &str) -> BTreeSet<String> {
    let out = std::process::Command::new(env!("CARGO"))
        .args([
            "tree",
            "--locked",
            "--offline",
            "-e",
            "normal",
            "--prefix",
            "none",
            "-p",
        ])
        .arg(package)
        .current_dir(common::root())
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// The core is what every transport shares and what the fuzz targets and benchmarks link: no
/// HTTP, TLS, AWS or Lambda crate among its dependencies, direct or not (the compiler then
/// keeps it from naming a transport or an AWS client).
#[test]
fn the_core_links_no_network_crate() {
    let core = normal_dependencies("podmutator-core");
    assert!(
        core.contains("k8s-openapi") && core.contains("serde_json"),
        "cargo tree lists the core's dependencies: {core:?}"
    );
    let network: Vec<_> = core.iter().filter(|c| is_network_crate(c)).collect();
    assert!(
        network.is_empty(),
        "podmutator-core depends on network crates: {network:?}"
    );
    // The check sees them where they are.
    let aws = normal_dependencies("podmutator-aws");
    for c in ["hyper", "tokio-rustls", "aws-sdk-secretsmanager"] {
        assert!(aws.contains(c) && is_network_crate(c), "{c} in {aws:?}");
    }
    let exec = normal_dependencies("podmutator-exec");
    assert!(
        exec.iter()
            .all(|c| !is_network_crate(c) && !c.starts_with("tokio")),
        "the exec wrapper links {exec:?}"
    );
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

/// The paths of docs/architecture.md's module map: the first word of every unindented line of
/// the fenced block under `## Module map` (indented lines continue a description), with a brace
/// list expanded (`src/secrets/{global,k8s}.rs` is two paths).
fn module_map(doc: &str) -> Vec<String> {
    let section = doc
        .split_once("\n## Module map\n")
        .expect("docs/architecture.md has a `## Module map` section")
        .1;
    let block = section
        .split_once("\n```\n")
        .expect("the module map is a fenced block")
        .1;
    let block = block
        .split_once("\n```")
        .expect("the module map's block is closed")
        .0;
    let mut paths = Vec::new();
    for line in block.lines() {
        if line.is_empty() || line.starts_with(char::is_whitespace) {
            continue;
        }
        let path = line.split_whitespace().next().unwrap();
        match path.split_once('{') {
            Some((head, rest)) => {
                let (list, tail) = rest.split_once('}').expect("a closed brace list");
                paths.extend(list.split(',').map(|item| format!("{head}{item}{tail}")));
            }
            None => paths.push(path.to_owned()),
        }
    }
    paths
}

/// The top-level modules `src/lib.rs` declares.
fn lib_modules(lib: &str) -> BTreeSet<String> {
    lib.lines()
        .filter_map(|line| {
            let line = line.trim();
            let rest = line
                .strip_prefix("pub mod ")
                .or_else(|| line.strip_prefix("mod "))?;
            Some(rest.strip_suffix(';')?.trim().to_owned())
        })
        .collect()
}

/// The workspace's crates under `crates/` (each directory with a Cargo.toml).
fn workspace_crates(root: &Path) -> BTreeSet<String> {
    std::fs::read_dir(root.join("crates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("Cargo.toml").is_file())
        .map(|p| p.file_name().unwrap().to_str().unwrap().to_owned())
        .collect()
}

/// What is wrong with `map`: a module or crate it leaves out, a path that does not exist, a
/// path under a crate's `src/` in no module of that crate. `modules` holds each crate's
/// top-level modules, by its `src/` directory (`src`, `crates/core/src`).
fn map_problems(
    map: &[String],
    modules: &BTreeMap<String, BTreeSet<String>>,
    crates: &BTreeSet<String>,
    exists: impl Fn(&str) -> bool,
) -> Vec<String> {
    let mut problems = Vec::new();
    let named = |prefix: &str, file: Option<&str>| {
        map.iter()
            .any(|p| p.starts_with(prefix) || file.is_some_and(|f| p == f))
    };
    for (src, mods) in modules {
        for m in mods {
            let file = format!("{src}/{m}.rs");
            if !named(&format!("{src}/{m}/"), Some(file.as_str())) {
                problems.push(format!("module `{m}` ({src}/lib.rs) is not in the map"));
            }
        }
    }
    for c in crates {
        if !named(&format!("crates/{c}/"), None) {
            problems.push(format!("crate crates/{c} is not in the map"));
        }
    }
    for p in map {
        if !exists(p) {
            problems.push(format!("the map names {p}, which does not exist"));
        }
        for (src, mods) in modules {
            let Some(rel) = p.strip_prefix(&format!("{src}/")) else {
                continue;
            };
            let first = rel.split('/').next().unwrap().trim_end_matches(".rs");
            if !matches!(first, "lib" | "main") && !mods.contains(first) {
                problems.push(format!(
                    "the map names {p}, in no module {src}/lib.rs declares"
                ));
            }
        }
    }
    problems
}

#[test]
fn the_module_map_names_every_module_and_nothing_else() {
    let root = common::root();
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let map = module_map(&doc);
    let modules: BTreeMap<String, BTreeSet<String>> = CRATE_SOURCES
        .iter()
        .map(|src| {
            let lib = std::fs::read_to_string(root.join(src).join("lib.rs")).unwrap();
            (src.to_string(), lib_modules(&lib))
        })
        .collect();
    let crates = workspace_crates(&root);
    assert!(
        modules["crates/core/src"].len() >= 10 && modules["src"].len() >= 3,
        "too few modules in the crates' lib.rs: {modules:?}"
    );
    assert!(!crates.is_empty(), "no crate found under crates/");
    let problems = map_problems(&map, &modules, &crates, |p| {
        let path = root.join(p);
        if p.ends_with('/') {
            path.is_dir()
        } else {
            path.exists()
        }
    });
    assert!(
        problems.is_empty(),
        "docs/architecture.md's module map disagrees with the tree:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn the_map_check_reports_a_missing_module_and_a_stale_path() {
    let doc = "# A\n\n## Module map\n\nText.\n\n```\nsrc/lib.rs     root\nsrc/a.rs       \
               the a module,\n               continued\nsrc/gone/x.rs  moved away\n\
               crates/one/    a crate\nsrc/{a,b}.rs\n```\n\n## Next\n";
    let map = module_map(doc);
    assert_eq!(
        map,
        [
            "src/lib.rs",
            "src/a.rs",
            "src/gone/x.rs",
            "crates/one/",
            "src/a.rs",
            "src/b.rs"
        ]
    );
    let modules: BTreeMap<String, BTreeSet<String>> =
        [("src".to_owned(), ["a", "c"].map(String::from).into())].into();
    let crates: BTreeSet<String> = ["one", "two"].map(String::from).into();
    let problems = map_problems(&map, &modules, &crates, |p| p != "src/gone/x.rs");
    assert_eq!(
        problems,
        [
            "module `c` (src/lib.rs) is not in the map",
            "crate crates/two is not in the map",
            "the map names src/gone/x.rs, which does not exist",
            "the map names src/gone/x.rs, in no module src/lib.rs declares",
            "the map names src/b.rs, in no module src/lib.rs declares",
        ]
    );
    assert_eq!(
        lib_modules("//! doc\n#![forbid(unsafe_code)]\n\npub mod a;\nmod b;\npub use a::X;\n"),
        BTreeSet::from(["a".to_owned(), "b".to_owned()])
    );
}

/// The `mod` items of a Rust file: `mod x;`, with or without a `#[path]` line before it.
fn declared_modules(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("mod "))
        .filter_map(|rest| rest.strip_suffix(';'))
        .map(str::to_owned)
        .collect()
}

/// The integration tests are one binary (`autotests = false` in Cargo.toml), so a file of
/// `tests/` that `tests/integration.rs` does not declare would never be compiled or run; the
/// same holds for `tests/attacks/` and `tests/attacks.rs`.
#[test]
fn every_test_file_is_a_module_of_the_test_binary() {
    let tests = common::root().join("tests");
    let stems = |dir: &Path| -> BTreeSet<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "rs"))
            .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
            .collect()
    };
    let read = |p: &Path| std::fs::read_to_string(p).unwrap();
    let mut files = stems(&tests);
    files.remove("integration");
    let declared = declared_modules(&read(&tests.join("integration.rs")));
    let missing: Vec<_> = files.difference(&declared).collect();
    assert!(
        missing.is_empty(),
        "tests/integration.rs does not declare {missing:?}: add `mod <name>;`"
    );
    let attacks = stems(&tests.join("attacks"));
    let declared = declared_modules(&read(&tests.join("attacks.rs")));
    let missing: Vec<_> = attacks.difference(&declared).collect();
    assert!(
        missing.is_empty(),
        "tests/attacks.rs does not declare {missing:?}: add `#[path = \"attacks/<name>.rs\"] mod <name>;`"
    );
    // The check itself sees an undeclared file.
    let partial = declared_modules("mod a;\n#[path = \"x/b.rs\"]\nmod b;\nfn c() {}\n");
    assert_eq!(partial, BTreeSet::from(["a".to_owned(), "b".to_owned()]));
}

/// The workspace's Rust source outside tests: every crate's `src/`.
fn workspace_source() -> String {
    let mut files = Vec::new();
    for dir in CRATE_SOURCES {
        rust_files(&common::root().join(dir), &mut files);
    }
    files
        .iter()
        .map(|f| code_of(&std::fs::read_to_string(f).unwrap()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The arguments of a written call or a declared parameter list, split at top-level commas.
fn arguments(list: &str) -> Vec<String> {
    let (mut out, mut depth, mut cur) = (Vec::new(), 0i32, String::new());
    for c in list.chars() {
        match c {
            '<' | '(' | '[' | '{' => depth += 1,
            '>' if !cur.ends_with('-') => depth -= 1,
            ')' | ']' | '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur).trim().to_owned());
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_owned());
    }
    out
}

/// Every declaration `fn name` in `source`: its parameters (`self` left out) and its return
/// type (`()` when none), whitespace removed.
fn declarations(source: &str, name: &str) -> Vec<(Vec<String>, String)> {
    let mut out = Vec::new();
    for (i, _) in source.match_indices(&format!("fn {name}")) {
        let rest = &source[i + 3 + name.len()..];
        // `fn name(` or `fn name<T>(`; not `fn names(`.
        let Some(open) = rest.find('(') else { continue };
        if !(rest.starts_with('(') || rest.starts_with('<')) {
            continue;
        }
        let mut depth = 0;
        let Some(close) = rest[open..].char_indices().find_map(|(j, c)| {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some(open + j);
                    }
                }
                _ => {}
            }
            None
        }) else {
            continue;
        };
        let params = arguments(&rest[open + 1..close])
            .into_iter()
            .filter(|p| {
                !p.trim_start_matches(['&', 'm', 'u', 't', ' '])
                    .starts_with("self")
                    && !p.ends_with("self")
            })
            .collect();
        let tail = &rest[close + 1..];
        let end = tail.find(['{', ';']).unwrap_or(tail.len());
        let tail = tail[..end].split(" where ").next().unwrap();
        let ret = tail.trim().strip_prefix("->").map_or("()".to_owned(), |r| {
            r.chars().filter(|c| !c.is_whitespace()).collect()
        });
        out.push((params, ret));
    }
    out
}

/// What docs/architecture.md names that the code does not have: a path (`src/…`, `crates/…`,
/// `tests/…`, …) that does not exist; a Rust item (`module::Item`, `Type::method`) whose last
/// name nothing declares; a signature (`Type::f(a, b) -> R`, in backticks or in the flow's
/// block) that no `fn f` has, by its number of arguments (`..` stands for any) and its return
/// type.
fn prose_problems(doc: &str, source: &str, exists: impl Fn(&str) -> bool) -> Vec<String> {
    let mut problems = Vec::new();
    let mut named: Vec<&str> = doc.split('`').skip(1).step_by(2).collect();
    // Signatures written in the fenced blocks too (the request flow).
    let signature = regex::Regex::new(
        r"(?:[A-Za-z_]\w*::)+[a-z_]\w*\([^()]*\)(?:\s*->\s*\w+(?:<[^<>]*(?:<[^<>]*>[^<>]*)*>)?)?",
    )
    .unwrap();
    for block in doc.split("```").skip(1).step_by(2) {
        named.extend(signature.find_iter(block).map(|m| m.as_str()));
    }
    const ROOTS: [&str; 10] = [
        "src/",
        "crates/",
        "tests/",
        "scripts/",
        "docs/",
        "benches/",
        "fuzz/",
        "events/",
        "deploy/",
        "examples/",
    ];
    // An item, or an enum variant: `Name,`, `Name(..)`, `Name {`, or one of `named_enum!`'s
    // (`Name = "name",`).
    let declared = |item: &str| {
        [
            "fn", "struct", "enum", "trait", "const", "type", "mod", "static", "as",
        ]
        .iter()
        .any(|kw| {
            source.match_indices(&format!("{kw} {item}")).any(|(i, _)| {
                let after = source[i + kw.len() + 1 + item.len()..].chars().next();
                !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
            })
        }) || regex::Regex::new(&format!(r#"(?m)^\s*{item}(\s*[({{,]|\s*$|\s*=\s*")"#))
            .unwrap()
            .is_match(source)
    };
    for text in named {
        let text = text.trim();
        if text.contains('<') && text.contains('/') || text.contains(' ') && !text.contains('(') {
            continue; // a placeholder path (`secrets/<name>.rs`) or prose
        }
        let (path, item) = match text.split_once("::") {
            Some((p, i)) if p.contains('/') => (Some(p), Some(i)),
            _ if text.contains('/') => (Some(text), None),
            _ => (None, Some(text)),
        };
        if let Some(p) = path {
            if ROOTS.iter().any(|r| p.starts_with(r)) && !exists(p) {
                problems.push(format!("`{text}`: {p} does not exist"));
            }
            if item.is_none() || !ROOTS.iter().any(|r| p.starts_with(r)) {
                continue;
            }
        }
        let item = item.unwrap();
        let Some(head) = item.split('(').next().filter(|h| h.contains("::")) else {
            continue;
        };
        if !head
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        {
            continue;
        }
        let last = head.rsplit("::").next().unwrap();
        if !declared(last) {
            problems.push(format!("`{text}`: nothing declares {last}"));
            continue;
        }
        let Some(call) = item.strip_prefix(head).and_then(|r| r.strip_prefix('(')) else {
            continue;
        };
        let (args, ret) = match call.split_once(')') {
            Some((args, rest)) => (args, rest.trim().strip_prefix("->").map(str::trim)),
            None => continue,
        };
        if args.contains('{') {
            continue; // a struct literal shown in place of an argument's type
        }
        let args = arguments(args);
        let any = args.iter().any(|a| a == "..");
        let ret: Option<String> = ret.map(|r| r.chars().filter(|c| !c.is_whitespace()).collect());
        let decls = declarations(source, last);
        let fits = decls.iter().any(|(params, r)| {
            let count = if any {
                params.len() + 1 >= args.len()
            } else {
                params.len() == args.len()
            };
            let r = r.replace("<'_>", "").replace("'_,", "").replace("<'a>", "");
            count && ret.as_ref().is_none_or(|want| r == *want)
        });
        if !fits && !decls.is_empty() {
            problems.push(format!(
                "`{text}`: no fn {last} takes {} arguments{}; the code has {decls:?}",
                args.len(),
                ret.map(|r| format!(" and returns {r}")).unwrap_or_default()
            ));
        }
    }
    problems
}

/// docs/architecture.md's prose names only what exists: paths, items and signatures.
#[test]
fn the_architecture_docs_name_only_paths_items_and_signatures_that_exist() {
    let root = common::root();
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let problems = prose_problems(&doc, &workspace_source(), |p| root.join(p).exists());
    assert!(
        problems.is_empty(),
        "docs/architecture.md and the code disagree:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_prose_check_reports_a_wrong_path_item_and_signature() {
    let source = "pub fn plan(&self, ctx: &PodCtx<'_>, pod: &Pod) -> Plan {}\nstruct Plan;";
    let doc = "`src/nowhere.rs`, `x::Missing`, `S::plan(&ctx, &pod) -> Result<Plan, Denial>`, \
               `S::plan(&ctx) -> Plan`, `S::plan(&ctx, &pod) -> Plan`, `S::plan(..) -> Plan`\n\
               ```\nflow: S::plan(&ctx, &pod, &more)\n```\n";
    let problems = prose_problems(doc, source, |p| p == "src/here.rs");
    assert_eq!(problems.len(), 5, "{problems:#?}");
    assert!(problems[0].contains("src/nowhere.rs does not exist"));
    assert!(problems[1].contains("nothing declares Missing"));
    assert!(problems[2].contains("returns Result<Plan,Denial>"));
    assert!(problems[3].contains("takes 1 arguments"));
    assert!(problems[4].contains("takes 3 arguments"));
    // A variant of `named_enum!` is declared as `Name = "name",`.
    let named = "crate::named_enum! {\n    pub enum Kind as as_str {\n        Embedded = \"Embedded\",\n    }\n}";
    assert!(prose_problems("`Kind::Embedded`", named, |_| true).is_empty());
    assert_eq!(prose_problems("`Kind::Vault`", named, |_| true).len(), 1);
}
