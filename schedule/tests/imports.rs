//! The modules of `schedule/src` import one another without circles (issue 52): atoms
//! below the IR, the IR below the sketches. Read from the code itself: every `crate::`
//! path outside comments and test modules, `use` lines and inline paths alike, names the
//! module it reaches (through `lib.rs`'s re-exports too). A module is a file or a folder;
//! the files of `atom/`, `lower/` and `sketch/` (its sketches' folders included) each
//! count as one, a `mod.rs` as its folder.

use petgraph::algo::tarjan_scc;
use petgraph::graphmap::DiGraphMap;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Folders whose files each count as a module (the sketch folders' too): the others
/// count as one module each.
const SPLIT: [&str; 3] = ["atom", "lower", "sketch"];

/// The module a path after `crate::` reaches, or None for the crate root's own items:
/// inside a split folder the deepest file or folder the path names.
fn reached(segments: &[&str], reexports: &BTreeMap<String, String>, src: &Path) -> Option<String> {
    let first = *segments.first()?;
    if let Some(module) = reexports.get(first) {
        return Some(module.clone());
    }
    if !(src.join(format!("{first}.rs")).exists() || src.join(first).is_dir()) {
        return None;
    }
    let mut module = first.to_string();
    if SPLIT.contains(&first) {
        for segment in &segments[1..] {
            let deeper = src.join(&module).join(segment);
            if deeper.with_extension("rs").exists() || deeper.is_dir() {
                module = format!("{module}/{segment}");
            } else {
                break;
            }
        }
    }
    Some(module)
}

/// Every path in a `crate::` import, braces expanded: `crate::{a, b::{c, d}}` gives
/// `a`, `b::c`, `b::d`.
fn paths(text: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        let end = if rest.starts_with('{') {
            let mut depth = 0;
            rest.char_indices()
                .find(|&(_, ch)| {
                    depth += i32::from(ch == '{') - i32::from(ch == '}');
                    depth == 0
                })
                .map_or(rest.len(), |(i, _)| i + 1)
        } else {
            rest.find(|ch: char| !(ch.is_alphanumeric() || ch == '_' || ch == ':'))
                .unwrap_or(rest.len())
        };
        expand(&[], &rest[..end], &mut out);
        rest = &rest[end..];
    }
    out
}

fn expand(prefix: &[String], tree: &str, out: &mut Vec<Vec<String>>) {
    let tree = tree.trim().trim_end_matches("::");
    if let Some(inner) = tree.strip_prefix('{').and_then(|t| t.strip_suffix('}')) {
        let (mut depth, mut start) = (0, 0);
        for (i, ch) in inner.char_indices().chain([(inner.len(), ',')]) {
            depth += i32::from(ch == '{') - i32::from(ch == '}');
            if ch == ',' && depth == 0 {
                expand(prefix, &inner[start..i], out);
                start = i + 1;
            }
        }
        return;
    }
    match tree.split_once("::{") {
        Some((head, braces)) => {
            let mut p = prefix.to_vec();
            p.extend(head.split("::").map(str::to_string));
            expand(&p, &format!("{{{braces}"), out);
        }
        None if !tree.is_empty() => {
            let mut p = prefix.to_vec();
            p.extend(tree.split("::").map(str::to_string));
            out.push(p);
        }
        None => {}
    }
}

/// The code of a file without comments and test-only items: a `#[cfg(test)]` item of
/// one line is skipped, a test module ends the file's code.
fn production_code(text: &str) -> String {
    let mut code = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.trim() == "#[cfg(test)]" {
            match lines.next() {
                Some(item) if item.trim_start().starts_with("mod ") && item.ends_with('{') => break,
                _ => continue,
            }
        }
        code.push(line.split("//").next().unwrap());
    }
    code.join("\n")
}

#[test]
fn no_module_of_schedule_imports_itself_through_others() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let mut reexports = BTreeMap::new();
    for line in lib.lines().filter_map(|l| l.strip_prefix("pub use ")) {
        let (module, names) = line.trim_end_matches(';').split_once("::").unwrap();
        for name in names.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
            if !name.is_empty() {
                reexports.insert(name.to_string(), module.to_string());
            }
        }
    }
    let mut modules: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut files = vec![src.clone()];
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            continue;
        }
        let relative = path.strip_prefix(&src).unwrap().with_extension("");
        let parts: Vec<String> = relative
            .iter()
            .map(|p| p.to_string_lossy().into())
            .collect();
        let module = match parts.as_slice() {
            [top] if top == "lib" => continue,
            [top, ..] if SPLIT.contains(&top.as_str()) => {
                let named = parts.strip_suffix(&["mod".to_string()]).unwrap_or(&parts);
                named.join("/")
            }
            [top, ..] => top.clone(),
            [] => continue,
        };
        let text = std::fs::read_to_string(&path).unwrap();
        let code = production_code(&text);
        let imports = modules.entry(module.clone()).or_default();
        for p in paths(&code) {
            let segments: Vec<&str> = p.iter().map(String::as_str).collect();
            if let Some(other) = reached(&segments, &reexports, &src)
                && other != module
            {
                imports.insert(other);
            }
        }
    }
    assert!(
        modules.len() > 40
            && modules["sketch/wgmma/lower"].contains("ir")
            && modules["state"].contains("sketch/wgmma/tiling"),
        "{modules:?}"
    );
    let mut graph: DiGraphMap<&str, ()> = DiGraphMap::new();
    for (module, imports) in &modules {
        graph.add_node(module.as_str());
        for other in imports {
            graph.add_edge(module.as_str(), other.as_str(), ());
        }
    }
    let circles: Vec<Vec<&str>> = tarjan_scc(&graph)
        .into_iter()
        .filter(|c| c.len() > 1)
        .collect();
    assert!(circles.is_empty(), "import circles: {circles:?}");
}

#[test]
fn test_only_items_and_modules_are_not_read() {
    let text = "use crate::a;\n#[cfg(test)]\nuse crate::b;\nfn f() {} // crate::c\n#[cfg(test)]\nmod tests {\n    use crate::d;\n}\n";
    let read: Vec<String> = paths(&production_code(text))
        .iter()
        .map(|p| p.join("::"))
        .collect();
    assert_eq!(read, ["a"]);
}

#[test]
fn crate_paths_are_read_with_their_braces() {
    let found = paths("use crate::{a, b::{c, d::e}};\nlet x = crate::f::g(1);");
    let joined: Vec<String> = found.iter().map(|p| p.join("::")).collect();
    assert_eq!(joined, ["a", "b::c", "b::d::e", "f::g"]);
}
