//! The crate's modules form no import circle: reading the `crate::` paths of each top-level
//! module's code (comments and unit tests left out), the graph of modules is acyclic.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The code of a file, without its `//` comments and its `#[cfg(test)] mod tests` block.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines()
        .map(|l| l.find("//").map_or(l, |i| &l[..i]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules each top-level module names through `crate::`.
fn edges(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let modules: BTreeSet<String> = std::fs::read_dir(src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter_map(|p| Some(p.file_stem()?.to_str()?.to_owned()))
        .filter(|m| m != "lib")
        .collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut files = vec![src.to_path_buf()];
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            continue;
        }
        let rel = path.strip_prefix(src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_str()
            .unwrap();
        let from = first.trim_end_matches(".rs").to_owned();
        if from == "lib" || path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = code(&std::fs::read_to_string(&path).unwrap());
        for (i, _) in text.match_indices("crate::") {
            let to: String = text[i + 7..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if to != from && modules.contains(&to) {
                edges.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    edges
}

/// A circle of the graph, if it has one (depth-first search).
fn circle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        m: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == m) {
            return Some(path[i..].to_vec());
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_owned());
        for to in edges.get(m).into_iter().flatten() {
            if let Some(c) = visit(to, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    edges
        .keys()
        .find_map(|m| visit(m, edges, &mut Vec::new(), &mut done))
}

#[test]
fn the_modules_import_no_circle() {
    let edges = edges(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(edges.len() > 10, "modules read: {edges:?}");
    assert_eq!(circle(&edges), None, "an import circle");
}

#[test]
fn a_circle_is_found() {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (a, b) in [
        ("call", "mcp"),
        ("mcp", "outcome"),
        ("outcome", "call"),
        ("x", "call"),
    ] {
        edges.entry(a.into()).or_default().insert(b.into());
    }
    let found = circle(&edges).unwrap();
    assert_eq!(found.len(), 3, "{found:?}");
}

/// The stages: each a layer of its own in the stack.
const STAGES: [&str; 7] = [
    "classify",
    "budget",
    "entropy",
    "breaker",
    "fifo",
    "deadline",
    "idempotency",
];

/// No stage imports another: what stages share goes through the kits (`admit`'s `Admission`,
/// `outcome`'s `Observer`, `clients`' `Judge`, the request `extensions`, the `response` future,
/// the `cost` table), so each layer stands alone in any stack.
#[test]
fn no_stage_imports_another() {
    let edges = edges(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let sideways: BTreeSet<(String, String)> = STAGES
        .iter()
        .flat_map(|from| {
            edges
                .get(*from)
                .into_iter()
                .flatten()
                .filter(|to| STAGES.contains(&to.as_str()))
                .map(move |to| ((*from).to_owned(), to.clone()))
        })
        .collect();
    assert_eq!(sideways, BTreeSet::new(), "the imports between stages");
}
