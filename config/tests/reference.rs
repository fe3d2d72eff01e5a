//! docs/configuration.md against the parser and the annotated example.
//!
//! The reference has one `## `[section]`` heading per TOML table, a table of fields (rows
//! starting with a backticked field name) and TOML example blocks. Four promises hold:
//!
//! 1. every example block is read by [`strait_config::parse`] (what `strait check` runs)
//!    without an unknown-field, type or syntax error;
//! 2. every field the reference's tables name appears in an example block of its section,
//!    so (with 1) every documented field is one the parser accepts: a misspelt field fails;
//! 3. every field the parser accepts in a section is documented there (the parser's own
//!    list, from the "expected one of" of an unknown-field error), so a new field cannot
//!    land without its row;
//! 4. every field of config/strait.example.toml, commented out or not, is documented.

use std::collections::{BTreeMap, BTreeSet};

use strait_config::{parse, ConfigError};

const REFERENCE: &str = include_str!("../../docs/configuration.md");

/// A section of the reference: its TOML path (`gateway.bgp.peers`), whether it is an array
/// of tables, the fields its table documents and its TOML blocks.
#[derive(Debug, Default)]
struct Section {
    array: bool,
    fields: BTreeSet<String>,
    blocks: Vec<String>,
}

/// The reference's sections by path.
fn sections(text: &str) -> BTreeMap<String, Section> {
    let mut out: BTreeMap<String, Section> = BTreeMap::new();
    let mut current: Option<String> = None;
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if let Some(heading) = line.strip_prefix("## ") {
            current = section_heading(heading).map(|(path, array)| {
                out.entry(path.clone()).or_default().array = array;
                path
            });
            continue;
        }
        let Some(path) = &current else { continue };
        if line.trim_start().starts_with("```toml") {
            let mut block = String::new();
            for l in lines.by_ref() {
                if l.trim_start().starts_with("```") {
                    break;
                }
                block.push_str(l);
                block.push('\n');
            }
            out.get_mut(path).unwrap().blocks.push(block);
        } else if let Some(rest) = line.strip_prefix("| `") {
            let field = rest.split('`').next().unwrap_or_default();
            out.get_mut(path).unwrap().fields.insert(field.to_owned());
        }
    }
    out
}

/// "`[gateway.bgp]`" -> ("gateway.bgp", false); "`[[services]]`" -> ("services", true).
fn section_heading(heading: &str) -> Option<(String, bool)> {
    let inner = heading.trim().strip_prefix('`')?.strip_suffix('`')?;
    if let Some(p) = inner.strip_prefix("[[").and_then(|s| s.strip_suffix("]]")) {
        return Some((p.to_owned(), true));
    }
    let p = inner.strip_prefix('[')?.strip_suffix(']')?;
    Some((p.to_owned(), false))
}

/// The leaf fields a TOML document sets, as `section.field` paths (array indexes dropped).
fn leaf_paths(doc: &toml::Table) -> BTreeSet<String> {
    fn walk(prefix: &str, table: &toml::Table, out: &mut BTreeSet<String>) {
        for (k, v) in table {
            let path = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            match v {
                toml::Value::Table(t) => walk(&path, t, out),
                toml::Value::Array(items)
                    if !items.is_empty() && items.iter().all(toml::Value::is_table) =>
                {
                    for item in items {
                        walk(&path, item.as_table().unwrap(), out);
                    }
                }
                _ => {
                    out.insert(path);
                }
            }
        }
    }
    let mut out = BTreeSet::new();
    walk("", doc, &mut out);
    out
}

/// The problems of `text` that say the parser could not read it as a configuration file
/// (syntax, unknown field, wrong type), as opposed to a valid-looking file that breaks a
/// rule (a missing interface, a required field left out of a short example).
fn reading_problems(text: &str) -> Vec<String> {
    match parse(text) {
        Ok(_) => Vec::new(),
        Err(ConfigError::Invalid(problems)) => problems
            .iter()
            .filter(|p| {
                p.message.contains("unknown field")
                    || p.message.contains("invalid type")
                    || p.message.contains("(line ")
            })
            .map(ToString::to_string)
            .collect(),
        Err(e) => vec![e.to_string()],
    }
}

/// The fields the parser accepts in the section at `path`: a document with that section
/// holding an unknown field, whose error lists what was expected.
fn accepted_fields(path: &str, all: &BTreeMap<String, Section>) -> BTreeSet<String> {
    const PROBE: &str = "zz_not_a_field";
    let mut doc = String::new();
    // Ancestors that are arrays of tables get a header of their own first, so the probe
    // lands in an element, as a real file would write it.
    let parts: Vec<&str> = path.split('.').collect();
    for n in 1..parts.len() {
        let ancestor = parts[..n].join(".");
        if all.get(&ancestor).is_some_and(|s| s.array) {
            doc.push_str(&format!("[[{ancestor}]]\n"));
        }
    }
    if !path.is_empty() {
        if all[path].array {
            doc.push_str(&format!("[[{path}]]\n"));
        } else {
            doc.push_str(&format!("[{path}]\n"));
        }
    }
    doc.push_str(&format!("{PROBE} = 1\n"));
    let Err(ConfigError::Invalid(problems)) = parse(&doc) else {
        panic!("the probe of [{path}] was not refused:\n{doc}");
    };
    let message = problems
        .iter()
        .find(|p| p.message.contains(PROBE))
        .unwrap_or_else(|| panic!("no unknown-field error for the probe of [{path}]: {problems:?}"))
        .message
        .clone();
    let expected = message
        .split_once("expected")
        .unwrap_or_else(|| panic!("no expected fields in {message:?}"))
        .1;
    // The names are backticked: "expected one of `a`, `b`", "expected `a` or `b`".
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// The `section.field` paths of the annotated example, commented-out lines included
/// (`# listen = "..."` under `# [gateway.sync]`).
fn example_paths(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut section = String::new();
    for line in text.lines() {
        let l = line.trim_start_matches('#').trim();
        if let Some(h) = l.strip_prefix('[') {
            let header = h.trim_start_matches('[');
            if let Some(end) = header.find(']') {
                let name = &header[..end];
                let after = header[end..].trim_start_matches(']').trim();
                // A header alone on its line (prose may name one: "[gateway.l2], ...").
                if (after.is_empty() || after.starts_with('#'))
                    && !name.is_empty()
                    && name.chars().all(|c| {
                        c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '.'
                    })
                {
                    section = name.to_owned();
                }
            }
            continue;
        }
        let Some((key, _)) = l.split_once(" = ") else {
            continue;
        };
        let key = key.trim();
        if !key.is_empty()
            && key
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            out.insert(if section.is_empty() {
                key.to_owned()
            } else {
                format!("{section}.{key}")
            });
        }
    }
    out
}

#[test]
fn the_reference_has_its_sections() {
    let all = sections(REFERENCE);
    for path in [
        "gateway",
        "gateway.timeouts",
        "gateway.interfaces",
        "services",
        "services.backends",
    ] {
        let s = all
            .get(path)
            .unwrap_or_else(|| panic!("docs/configuration.md has no section [{path}]"));
        assert!(!s.fields.is_empty(), "[{path}] documents no field");
        assert!(!s.blocks.is_empty(), "[{path}] has no TOML example");
    }
}

#[test]
fn every_example_block_is_read_by_the_parser() {
    let all = sections(REFERENCE);
    for (path, s) in &all {
        for block in &s.blocks {
            let problems = reading_problems(block);
            assert!(
                problems.is_empty(),
                "docs/configuration.md, [{path}]: the parser refuses this example:\n{block}\n{problems:#?}"
            );
        }
    }
}

#[test]
fn every_documented_field_is_in_an_example_of_its_section() {
    let all = sections(REFERENCE);
    for (path, s) in &all {
        let mut shown = BTreeSet::new();
        for block in &s.blocks {
            let doc: toml::Table = block
                .parse()
                .unwrap_or_else(|e| panic!("[{path}] example is not TOML: {e}\n{block}"));
            shown.extend(leaf_paths(&doc));
        }
        for field in &s.fields {
            let want = if path.is_empty() {
                field.clone()
            } else {
                format!("{path}.{field}")
            };
            assert!(
                shown.contains(&want),
                "docs/configuration.md documents `{field}` in [{path}] but no example of the section sets {want}"
            );
        }
    }
}

#[test]
fn every_field_the_parser_accepts_is_documented() {
    let all = sections(REFERENCE);
    let mut paths: Vec<String> = vec![String::new()];
    paths.extend(all.keys().cloned());
    for path in &paths {
        for field in accepted_fields(path, &all) {
            let sub = if path.is_empty() {
                field.clone()
            } else {
                format!("{path}.{field}")
            };
            let documented =
                all.get(path).is_some_and(|s| s.fields.contains(&field)) || all.contains_key(&sub);
            assert!(
                documented,
                "the parser accepts `{field}` in [{path}], but docs/configuration.md has no row for it (or section [{sub}])"
            );
        }
    }
}

#[test]
fn every_field_of_the_annotated_example_is_documented() {
    let all = sections(REFERENCE);
    let example = example_paths(strait_config::EXAMPLE);
    assert!(example.len() > 40, "too few fields read: {example:?}");
    for path in example {
        let (section, field) = path.rsplit_once('.').unwrap_or(("", &path));
        assert!(
            all.get(section).is_some_and(|s| s.fields.contains(field)),
            "config/strait.example.toml sets {path}, which docs/configuration.md does not document"
        );
    }
}

/// The checks above would pass on anything if their readers found nothing: a misspelt field
/// in an example block is refused, a documented field missing from the examples is seen.
#[test]
fn a_misspelt_field_fails_the_checks() {
    let bad = "\
## `[gateway.timeouts]`

| field | type | default | what it does | refused |
|---|---|---|---|---|
| `tcp_synn` | duration | `\"30s\"` | misspelt | |

```toml
[gateway.timeouts]
tcp_synn = \"30s\"
```
";
    let all = sections(bad);
    let s = &all["gateway.timeouts"];
    assert_eq!(s.fields, BTreeSet::from(["tcp_synn".to_owned()]));
    let problems = reading_problems(&s.blocks[0]);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("unknown field `tcp_synn`"),
        "{problems:?}"
    );
    let accepted = accepted_fields("gateway.timeouts", &all);
    assert!(accepted.contains("tcp_syn") && !accepted.contains("tcp_synn"));
}
