//! `docs/configuration.md` against the configuration types, in both directions, so the document
//! cannot drift from the code:
//!
//! - every key of `podmutator_core::Config::default()`, serialised to JSON, is a table row whose first
//!   cell is its full dotted path in backticks (each top-level section is a `## `-heading
//!   instead, and a row only when the section is a map); objects are rows too, and the walk stops at a key whose type cell says `map` or
//!   names a Kubernetes type (their keys are the user's or Kubernetes');
//! - every row names a real key (or a key under such a map, like `mutators.<id>.required`), once;
//! - every backticked dotted path in any table cell that starts with a section name is a real key;
//! - each row's type agrees with the JSON value, "unset" is written exactly for the keys whose
//!   default is absent, and a default cell that starts with a literal starts with the real
//!   default.
//!
//! Only the public `podmutator_core::Config` API is used.
//!
//! And every test the docs (docs/*.md, README.md, CHANGELOG.md) name as evidence, in backticks,
//! is a test function in the file its path names.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde_json::Value;

const DOC: &str = "docs/configuration.md";

struct Row {
    line: usize,
    key: String,
    ty: String,
    default: String,
    cells: Vec<String>,
}

fn doc() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(DOC);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// Splits a Markdown table line into trimmed cells; a `|` inside backticks is not a separator.
fn cells(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
    let mut out = vec![String::new()];
    let mut in_code = false;
    for c in inner.chars() {
        match c {
            '`' => {
                in_code = !in_code;
                out.last_mut().unwrap().push(c);
            }
            '|' if !in_code => out.push(String::new()),
            c => out.last_mut().unwrap().push(c),
        }
    }
    out.iter().map(|c| c.trim().to_owned()).collect()
}

/// The text between each pair of backticks.
fn backticked(s: &str) -> Vec<&str> {
    s.split('`').skip(1).step_by(2).collect()
}

fn rows(doc: &str) -> Vec<Row> {
    let mut out = Vec::new();
    for (i, line) in doc.lines().enumerate() {
        if !line.trim_start().starts_with('|') {
            continue;
        }
        let cells = cells(line);
        if cells[0] == "key" || cells[0].starts_with("---") {
            continue;
        }
        assert_eq!(
            cells.len(),
            4,
            "{DOC}:{}: a row has 4 cells (key | type | default | meaning): {line}",
            i + 1
        );
        let key = match backticked(&cells[0]).as_slice() {
            [k] if cells[0] == format!("`{k}`") => (*k).to_owned(),
            _ => panic!(
                "{DOC}:{}: the key cell must be one backticked dotted path, got {:?}",
                i + 1,
                cells[0]
            ),
        };
        out.push(Row {
            line: i + 1,
            key,
            ty: cells[1].clone(),
            default: cells[2].clone(),
            cells,
        });
    }
    out
}

/// A map or a Kubernetes object: its keys are not ours to document.
fn opaque(ty: &str) -> bool {
    ty.starts_with("map") || ty.starts_with("Kubernetes")
}

/// Every key path of `v` under `prefix`, stopping at opaque keys.
fn walk<'a>(
    v: &'a Value,
    prefix: &str,
    stop: &BTreeSet<String>,
    out: &mut BTreeMap<String, &'a Value>,
) {
    let Value::Object(m) = v else { return };
    for (k, child) in m {
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        out.insert(path.clone(), child);
        if !stop.contains(&path) {
            walk(child, &path, stop, out);
        }
    }
}

/// How a default is written in the table: strings bare or quoted, anything else as JSON.
fn renders(v: &Value, literal: &str) -> bool {
    match v {
        Value::String(s) => literal == s || literal == serde_json::to_string(s).unwrap(),
        v => literal == serde_json::to_string(v).unwrap(),
    }
}

fn type_agrees(ty: &str, v: &Value) -> Result<(), String> {
    let first = ty.split_whitespace().next().unwrap_or("");
    let ok = match first {
        _ if v.is_null() => true,
        "bool" => v.is_boolean(),
        "integer" => v.is_u64() || v.is_i64(),
        "string" => v.is_string(),
        "list" => v.is_array(),
        "object" => v.as_object().is_some_and(|m| !m.is_empty()),
        "map" | "Kubernetes" => v.is_object(),
        other => return Err(format!("unknown type {other:?}")),
    };
    if ok {
        Ok(())
    } else {
        Err(format!("type {ty:?} but the default is {v}"))
    }
}

fn path_like(token: &str, sections: &BTreeSet<String>) -> bool {
    let Some((first, rest)) = token.split_once('.') else {
        return false;
    };
    sections.contains(first)
        && !rest.is_empty()
        && rest
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-<>".contains(c))
}

/// Every disagreement between `doc` and the serialised configuration `config`.
fn problems(doc: &str, config: &Value) -> Vec<String> {
    let rows = rows(doc);

    let stop: BTreeSet<String> = rows
        .iter()
        .filter(|r| opaque(&r.ty))
        .map(|r| r.key.clone())
        .collect();
    let mut keys = BTreeMap::new();
    walk(config, "", &stop, &mut keys);
    let sections: BTreeSet<String> = config
        .as_object()
        .expect("Config serialises to an object")
        .keys()
        .cloned()
        .collect();
    let under_opaque = |k: &str| stop.iter().any(|s| k.starts_with(&format!("{s}.")));

    let mut problems = Vec::new();
    let mut by_key: BTreeMap<&str, &Row> = BTreeMap::new();
    for r in &rows {
        if let Some(first) = by_key.insert(r.key.as_str(), r) {
            problems.push(format!(
                "{DOC}:{}: `{}` is documented twice (also line {})",
                r.line, r.key, first.line
            ));
        }
    }

    // Code -> doc: every key is documented.
    for (key, value) in &keys {
        if sections.contains(key) {
            if !doc.lines().any(|l| l.trim() == format!("## `{key}`")) {
                problems.push(format!(
                    "{DOC}: no heading \"## `{key}`\" for section {key}"
                ));
            }
            continue;
        }
        let Some(row) = by_key.get(key.as_str()) else {
            problems.push(format!(
                "{DOC}: key `{key}` (default {value}) has no table row"
            ));
            continue;
        };
        if let Err(e) = type_agrees(&row.ty, value) {
            problems.push(format!("{DOC}:{}: `{key}`: {e}", row.line));
        }
        if value.is_null() != row.default.starts_with("unset") {
            problems.push(format!(
                "{DOC}:{}: `{key}`: the default is {value}, so the default cell starts with \"unset\" exactly when it is null; got {:?}",
                row.line, row.default
            ));
        }
        if let Some(literal) = backticked(&row.default).first()
            && row.default.starts_with('`')
            && !renders(value, literal)
        {
            problems.push(format!(
                "{DOC}:{}: `{key}`: the default cell says `{literal}`, the code's default is {value}",
                row.line
            ));
        }
    }

    // Doc -> code: every row, and every dotted path in a table, names a real key.
    for r in &rows {
        if !keys.contains_key(&r.key) && !under_opaque(&r.key) {
            problems.push(format!(
                "{DOC}:{}: `{}` is not a configuration key",
                r.line, r.key
            ));
        }
        if sections.contains(&r.key) && !stop.contains(&r.key) {
            problems.push(format!(
                "{DOC}:{}: section `{}` is a heading, not a row (unless it is a map)",
                r.line, r.key
            ));
        }
        for cell in &r.cells[1..] {
            for token in backticked(cell) {
                if path_like(token, &sections) && !keys.contains_key(token) && !under_opaque(token)
                {
                    problems.push(format!(
                        "{DOC}:{}: `{token}` (in the row of `{}`) is not a configuration key",
                        r.line, r.key
                    ));
                }
            }
        }
    }

    problems
}

fn config_json() -> Value {
    serde_json::to_value(podmutator_core::Config::default())
        .expect("podmutator_core::Config serialises to JSON")
}

#[test]
fn configuration_doc_matches_the_config_types() {
    let doc = doc();
    assert!(
        rows(&doc).len() > 50,
        "{DOC}: only {} rows found",
        rows(&doc).len()
    );
    let problems = problems(&doc, &config_json());
    assert!(
        problems.is_empty(),
        "{DOC} and podmutator_core::Config disagree ({} problems):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// The check can fail: a missing row, an invented key, a wrong default and a wrong type are
/// each reported.
#[test]
fn the_check_reports_drift_in_either_direction() {
    let doc = doc();
    let line = |key: &str| {
        doc.lines()
            .find(|l| l.starts_with(&format!("| `{key}` |")))
            .unwrap_or_else(|| panic!("{DOC} has no row for {key}"))
            .to_owned()
    };
    let deadline = line("embedded.deadlineMs");
    let batch = line("embedded.batchSize");
    let enabled = line("metrics.enabled");
    let drifted = doc
        .replace(&format!("{deadline}\n"), "")
        .replace(
            &batch,
            "| `embedded.batchSize` | integer | `25` | ids per call |\n| `embedded.deadlineSeconds` | integer | `2` | invented |",
        )
        .replace(&enabled, "| `metrics.enabled` | string | `true` | wrong type |");
    let found = problems(&drifted, &config_json()).join("\n");
    for expected in [
        "key `embedded.deadlineMs` (default 2000) has no table row",
        "`embedded.deadlineSeconds` is not a configuration key",
        "the default cell says `25`, the code's default is 20",
        "`metrics.enabled`: type \"string\" but the default is true",
    ] {
        assert!(found.contains(expected), "{expected:?} not in:\n{found}");
    }
}

#[test]
fn the_helpers_parse_tables_and_paths() {
    let config = serde_json::to_value(podmutator_core::Config::default()).unwrap();
    let mut keys = BTreeMap::new();
    walk(&config, "", &BTreeSet::new(), &mut keys);
    assert!(keys.contains_key("embedded.deadlineMs"), "{keys:?}");
    assert!(keys.contains_key("webhook.secretManagerTypes"));
    assert!(!keys.contains_key("embedded.deadlineSeconds"));
    let sections: BTreeSet<String> = ["embedded".to_owned()].into();
    assert!(path_like("embedded.deadlineMs", &sections));
    assert!(!path_like("csi.aether.io", &sections));
    assert_eq!(
        cells("| `a` | b `x|y` | c | d |"),
        ["`a`", "b `x|y`", "c", "d"]
    );
}

/// The documents that name tests as evidence (security.md's "proved by" column, and the rest).
fn evidence_docs() -> Vec<(String, String)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut paths: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/ is readable")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    paths.sort();
    paths.push(root.join("README.md"));
    paths.push(root.join("CHANGELOG.md"));
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()));
            let name = p.strip_prefix(&root).unwrap().display().to_string();
            (name, text)
        })
        .collect()
}

/// Whether `source` holds a test function `name`: a `fn name` whose attributes (the lines
/// above it, up to a blank line or the previous item's end) include `#[test]`,
/// `#[tokio::test]` or `#[rstest]`.
fn has_test_fn(source: &str, name: &str) -> bool {
    let head = regex::Regex::new(&format!(
        r"^(pub(\([a-z]+\))? )?(async )?fn {}\b",
        regex::escape(name)
    ))
    .unwrap();
    let attr = regex::Regex::new(r"#\[(tokio::test|test|rstest|rstest::rstest)\b").unwrap();
    let lines: Vec<&str> = source.lines().collect();
    lines.iter().enumerate().any(|(i, line)| {
        head.is_match(line.trim_start())
            && lines[..i]
                .iter()
                .rev()
                .map(|l| l.trim())
                .take_while(|l| !l.is_empty() && *l != "}" && !l.ends_with(';'))
                .any(|l| attr.is_match(l))
    })
}

/// Every backticked test reference in `docs` that names no test function. A reference is
/// `<module>::…::<name>` whose first segment is a module of the integration binary (a file or
/// folder of tests/), or `<src, tests or crates/<crate>/src file>.rs::<name>`, or `::<name>` after one of those
/// in the same line (the same file again); and `<name>` reads as a test's sentence (four words
/// or more) or is the name of a test somewhere. So `podmutator_core::config` (no test module),
/// `cli::embedded_source` (a short name that no test has) and `file::test` are not references.
/// A reference must name a test in the file its path gives: `attacks::x` in tests/attacks.rs,
/// `attacks::serve::x` in tests/attacks/serve.rs.
fn test_reference_problems(
    docs: &[(String, String)],
    read: &dyn Fn(&str) -> Option<String>,
) -> (usize, Vec<String>) {
    let shape = regex::Regex::new(
        r"^((?:[a-z_][a-z0-9_]*|(?:src|tests|crates/[a-z0-9-]+/(?:src|tests))/[A-Za-z0-9_/]+\.rs)?)((?:::[a-z_][a-z0-9_]*)+)$",
    )
    .unwrap();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let test_modules: BTreeSet<String> = std::fs::read_dir(root.join("tests"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir() || p.extension().is_some_and(|e| e == "rs"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .filter(|m| m != "common" && m != "integration")
        .collect();
    let any_test = |name: &str| {
        test_modules.iter().any(|m| {
            read(&format!("tests/{m}.rs")).is_some_and(|s| has_test_fn(&s, name))
                || std::fs::read_dir(root.join("tests").join(m)).is_ok_and(|d| {
                    d.filter_map(|e| e.ok())
                        .filter_map(|e| {
                            let rel = e.path().strip_prefix(&root).ok()?.display().to_string();
                            read(&rel)
                        })
                        .any(|s| has_test_fn(&s, name))
                })
        })
    };
    let mut problems = Vec::new();
    let mut checked = 0;
    for (doc, text) in docs {
        for (n, line) in text.lines().enumerate() {
            let mut previous: Option<String> = None;
            for token in backticked(line) {
                let Some(m) = shape.captures(token) else {
                    continue;
                };
                let segments: Vec<&str> = m[2].split("::").skip(1).collect();
                let (name, inner) = segments.split_last().unwrap();
                let head = match (&m[1], &previous) {
                    ("", Some(p)) => p.clone(),
                    ("", None) => continue,
                    (h, _) => h.to_owned(),
                };
                let file_ref = head.ends_with(".rs");
                let first = head.split("::").next().unwrap();
                if !file_ref && !test_modules.contains(first) {
                    continue;
                }
                if name.matches('_').count() < 3 && !any_test(name) {
                    continue;
                }
                let file = if file_ref {
                    // `<file>.rs::tests::<name>`: an inline module of that file.
                    previous = Some(head.clone());
                    head
                } else {
                    let module: Vec<&str> = head.split("::").chain(inner.iter().copied()).collect();
                    previous = Some(module.join("::"));
                    format!("tests/{}.rs", module.join("/"))
                };
                checked += 1;
                match read(&file) {
                    Some(source) if has_test_fn(&source, name) => {}
                    Some(_) => problems.push(format!(
                        "{doc}:{}: `{token}`: {file} has no test `{name}`",
                        n + 1
                    )),
                    None => problems.push(format!(
                        "{doc}:{}: `{token}`: no file {file} for this module",
                        n + 1
                    )),
                }
            }
        }
    }
    (checked, problems)
}

fn read_repo_file(rel: &str) -> Option<String> {
    std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel)).ok()
}

#[test]
fn every_test_the_docs_name_exists_where_they_say() {
    let docs = evidence_docs();
    let (checked, problems) = test_reference_problems(&docs, &read_repo_file);
    // security.md alone names over a hundred.
    assert!(checked > 100, "only {checked} test references found");
    assert!(
        problems.is_empty(),
        "docs name tests that do not exist ({}):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// The reference check can fail: a misspelt test, a test in another file of its module and a
/// continuation `::name` of a wrong file are reported; Rust paths and short names are not
/// taken for tests.
#[test]
fn the_test_reference_check_reports_wrong_names_and_skips_rust_paths() {
    let doc = [
        "| a | `attacks::a_guessed_token_gets_404_and_the_right_one_is_admitted` |",
        "| b | `attacks::a_guessed_token_gets_405_and_the_right_one_is_admitted` |",
        "| c | `attacks::large_bodies_sent_to_a_wrong_token_are_read_to_the_end_and_all_get_their_404` |",
        "| d | `embedded_aws::the_worst_allowed_pod_costs_192_calls_cold_none_warm_and_one_more_request_none`, `::no_such_test_in_the_same_file` |",
        "| e | `podmutator_core::config`, `cli::embedded_source`, `file::test`, `podmutator_aws::secretsmanager::AwsSource`, `cli::` |",
        "| f | `no_such_module::a_test_that_is_not_there` |",
    ]
    .join("\n");
    let (checked, found) = test_reference_problems(&[("x.md".into(), doc)], &read_repo_file);
    assert_eq!(checked, 5, "rows a to d hold five references; e and f none");
    let expected = [
        "x.md:2: `attacks::a_guessed_token_gets_405_and_the_right_one_is_admitted`: tests/attacks.rs has no test `a_guessed_token_gets_405_and_the_right_one_is_admitted`",
        "x.md:3: `attacks::large_bodies_sent_to_a_wrong_token_are_read_to_the_end_and_all_get_their_404`: tests/attacks.rs has no test `large_bodies_sent_to_a_wrong_token_are_read_to_the_end_and_all_get_their_404`",
        "x.md:4: `::no_such_test_in_the_same_file`: tests/embedded_aws.rs has no test `no_such_test_in_the_same_file`",
    ];
    assert_eq!(found, expected);
}

/// `check-config --changed` names the keys read that podmutator never uses
/// (`podmutator_core::config::UNUSED_KEYS`): exactly the rows of docs/configuration.md that say so.
#[test]
fn the_unused_keys_are_the_rows_that_say_unused() {
    let said: BTreeSet<String> = rows(&doc())
        .iter()
        .filter(|r| r.cells[3].contains("unused"))
        .map(|r| r.key.clone())
        .collect();
    let listed: BTreeSet<String> = podmutator_core::config::UNUSED_KEYS
        .iter()
        .map(|k| k.to_string())
        .collect();
    assert_eq!(said, listed);
}

/// GitHub's anchor of a heading: lower case, spaces to `-`, every character but letters,
/// digits, `-` and `_` dropped; a repeated heading gets `-1`, `-2`, ...
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let text = line.trim_start_matches('#').trim();
        let slug: String = text
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let n = seen.entry(slug.clone()).or_insert(0);
        out.insert(if *n == 0 {
            slug.clone()
        } else {
            format!("{slug}-{n}")
        });
        *n += 1;
    }
    out
}

/// Every relative link of the README, CHANGELOG and docs/ leads to a file that exists, and a
/// link with `#anchor` to a heading of that file.
#[test]
fn every_relative_link_and_anchor_in_the_docs_resolves() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut docs = vec![root.join("README.md"), root.join("CHANGELOG.md")];
    for e in std::fs::read_dir(root.join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            docs.push(p);
        }
    }
    let mut broken = Vec::new();
    for doc in &docs {
        let text = std::fs::read_to_string(doc).unwrap();
        for (i, line) in text.lines().enumerate() {
            for target in line.split("](").skip(1).filter_map(|t| t.split(')').next()) {
                if target.contains("://") || target.starts_with("mailto:") || target.contains(' ') {
                    continue;
                }
                let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
                let file = if path.is_empty() {
                    doc.clone()
                } else {
                    doc.parent().unwrap().join(path)
                };
                let at = format!(
                    "{}:{}: {target}",
                    doc.strip_prefix(&root).unwrap().display(),
                    i + 1
                );
                if !file.exists() {
                    broken.push(format!("{at}: no such file"));
                    continue;
                }
                if !anchor.is_empty() && file.extension().is_some_and(|x| x == "md") {
                    let heads = anchors(&std::fs::read_to_string(&file).unwrap());
                    if !heads.contains(anchor) {
                        broken.push(format!("{at}: no such heading"));
                    }
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// `scripts/doc-commands.py DOC#NAME` runs the one block that `<!-- doc-commands: NAME -->`
/// names, wherever it sits in the document; a name with no block, or with two, fails and lists
/// the names there are.
#[test]
fn doc_commands_selects_a_block_by_its_marker() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let doc = crate::common::temp_dir("doc-commands").join("doc.md");
    std::fs::write(
        &doc,
        "```sh\necho block-one\n```\n\n<!-- doc-commands: second -->\n```sh\necho block-two\n```\n\n  <!-- doc-commands: twice -->\n  ```sh\n  echo three\n  ```\n<!-- doc-commands: twice -->\n```sh\necho four\n```\n",
    )
    .unwrap();
    let run = |selector: &str| {
        std::process::Command::new(root.join("scripts/doc-commands.py"))
            .arg(format!("{}{selector}", doc.display()))
            .output()
            .unwrap()
    };
    let out = run("#second");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("block-two") && !stdout.contains("block-one"),
        "{stdout}"
    );
    for missing in ["#nothing", "#twice"] {
        let out = run(missing);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{missing}: {stderr}");
        assert!(
            stderr.contains("['second', 'twice']"),
            "{missing}: {stderr}"
        );
    }
}

/// Every `DOC#NAME` that `.ci/run` runs names exactly one block: a marker deleted or copied
/// fails here, not as a CI step that runs nothing or the wrong commands.
#[test]
fn every_block_ci_runs_by_name_is_there_once() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let ci = std::fs::read_to_string(root.join(".ci/run")).unwrap();
    let selectors: Vec<&str> = ci
        .split_whitespace()
        .filter(|w| w.contains(".md#"))
        .collect();
    assert!(selectors.len() >= 5, "{selectors:?}");
    for selector in selectors {
        let (path, name) = selector.split_once('#').unwrap();
        let marker = format!("<!-- doc-commands: {name} -->");
        let text = std::fs::read_to_string(root.join(path)).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let at: Vec<usize> = (0..lines.len())
            .filter(|&i| lines[i].trim() == marker)
            .collect();
        assert_eq!(
            at.len(),
            1,
            "{selector}: {marker} appears {} times",
            at.len()
        );
        assert_eq!(
            lines.get(at[0] + 1).map(|l| l.trim()),
            Some("```sh"),
            "{selector}: the marker is not on the line before a sh block"
        );
    }
}
