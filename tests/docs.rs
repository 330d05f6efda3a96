//! The docs stay true: every configuration key docs/configuration.md lists is one the
//! configuration types accept, and every key they accept is listed; every metric name the
//! docs and the dashboards use is one the code records; every relative link resolves.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use stormgate::control::Config;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Keys the reload document reads besides the configuration's own (`replace = true`).
const DOCUMENT_KEYS: [&str; 1] = ["replace"];

/// How the configuration types answer a probe: the error of parsing `toml`, if any.
fn probe(toml: &str) -> Option<String> {
    toml::from_str::<Config>(toml).err().map(|e| e.to_string())
}

/// The field names an "unknown field `x`, expected one of `a`, `b`" error lists, if it is one.
fn expected_fields(error: &str) -> Option<Vec<String>> {
    let rest = error.split("unknown field `__probe`").nth(1)?;
    if rest.contains("there are no fields") {
        return Some(Vec::new());
    }
    Some(
        rest.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect(),
    )
}

/// The TOML that opens table `path` (dotted, `<>` a map key) with `body` in it.
fn table(path: &[String], body: &str) -> String {
    if path.is_empty() {
        return format!("{body}\n");
    }
    let name: Vec<String> = path
        .iter()
        .map(|p| {
            if p == "<>" {
                "probe_key".to_owned()
            } else {
                p.clone()
            }
        })
        .collect();
    format!("[{}]\n{body}\n", name.join("."))
}

/// Every key the configuration types accept under the table at `path`, dotted, map keys as
/// `<>`: a struct lists its fields when given an unknown one; a field is a table when it
/// lists fields of its own, a map when any key is accepted in it, else a value.
fn keys_under(path: Vec<String>, out: &mut BTreeSet<String>) {
    let error = probe(&table(&path, "__probe = 1"));
    match error.as_deref().and_then(expected_fields) {
        Some(fields) => {
            for field in fields {
                let mut sub = path.clone();
                sub.push(field);
                classify(sub, out);
            }
        }
        // Any key accepted (or only its value's type refused): a map.
        None => {
            let mut sub = path.clone();
            sub.push("<>".to_owned());
            classify(sub, out);
        }
    }
}

/// `path` is a key: a table of keys, a map, or a value. Written as a table, a value's type
/// refuses it (`invalid type: map`, or no variant of an enum matches); a table's does not.
fn classify(path: Vec<String>, out: &mut BTreeSet<String>) {
    let error = probe(&table(&path, "__probe = 1"));
    let value = error.as_deref().is_some_and(|e| {
        e.contains("invalid type: map")
            || e.contains("did not match any variant")
            || e.contains("unknown variant")
    });
    if value || path.len() >= 6 {
        out.insert(path.join("."));
    } else {
        keys_under(path, out);
    }
}

/// The keys docs/configuration.md lists: the first cell of each table row, in backticks,
/// map keys (`<tool>`, `<key>`, ...) as `<>`.
fn documented_keys() -> BTreeSet<String> {
    let text = std::fs::read_to_string(Path::new(ROOT).join("docs/configuration.md"))
        .expect("docs/configuration.md");
    text.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(|key| {
            key.split('.')
                .map(|p| if p.starts_with('<') { "<>" } else { p })
                .collect::<Vec<_>>()
                .join(".")
        })
        .collect()
}

#[test]
fn every_configuration_key_is_documented_and_every_documented_key_exists() {
    let mut accepted = BTreeSet::new();
    keys_under(Vec::new(), &mut accepted);
    accepted.extend(DOCUMENT_KEYS.iter().map(|k| (*k).to_owned()));
    assert!(
        accepted.len() > 50,
        "the probe found the keys: {accepted:?}"
    );
    let documented = documented_keys();
    let missing: Vec<_> = accepted.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&accepted).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "keys the configuration accepts that docs/configuration.md does not list: {missing:?}\n\
         keys it lists that the configuration does not accept: {unknown:?}"
    );
}

/// Every `stormgate_*` name in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("stormgate_") {
        let name: String = rest[i..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        rest = &rest[i + name.len()..];
        names.insert(name);
    }
    names
}

/// The files of `dir` (not recursive) ending in `ext`.
fn files(dir: &str, ext: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(Path::new(ROOT).join(dir))
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    out.sort();
    out
}

/// The Markdown documents a reader follows: the README, ARCHITECTURE.md, docs/.
fn documents() -> Vec<PathBuf> {
    let mut docs = vec![
        Path::new(ROOT).join("README.md"),
        Path::new(ROOT).join("ARCHITECTURE.md"),
    ];
    docs.extend(files("docs", "md"));
    docs
}

#[test]
fn every_metric_name_in_the_docs_and_dashboards_is_recorded_by_the_code() {
    let code =
        metric_names(&std::fs::read_to_string(Path::new(ROOT).join("src/metrics.rs")).unwrap());
    assert!(code.len() > 30, "{code:?}");
    let mut used = Vec::new();
    for path in documents().into_iter().chain(files("dashboards", "json")) {
        let text = std::fs::read_to_string(&path).unwrap();
        for name in metric_names(&text) {
            used.push((path.clone(), name));
        }
    }
    let unknown: Vec<_> = used
        .iter()
        .filter(|(_, name)| {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            // Or a family's prefix, as a `grep stormgate_shared` writes it.
            let family = code.iter().any(|c| c.starts_with(&format!("{name}_")));
            !(code.contains(name.as_str()) || code.contains(base) || family)
        })
        .collect();
    assert!(
        unknown.is_empty(),
        "metric names the code does not record: {unknown:?}"
    );
}

#[test]
fn every_relative_link_resolves() {
    let mut broken = Vec::new();
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap_or_else(|e| panic!("{doc:?}: {e}"));
        let dir = doc.parent().unwrap();
        for (i, _) in text.match_indices("](") {
            let target: String = text[i + 2..].chars().take_while(|c| *c != ')').collect();
            let target = target.split('#').next().unwrap().trim();
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            if !dir.join(target).exists() {
                broken.push(format!("{}: {target}", doc.display()));
            }
        }
    }
    assert!(broken.is_empty(), "links to nothing: {broken:?}");
}
