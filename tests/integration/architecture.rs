//! The crate's import graph has no cycle (issue #23): data flows one way between the top-level
//! modules (`data` → `train`, `fewshot` → `rerank`, `stats` → `report` → `experiments`, …) and
//! between the files of a module.
//!
//! The graph is read from the source text: every `crate::…` and `super::…` path outside
//! comments and `#[cfg(test)]` modules is an edge from the file it appears in to the longest
//! prefix of the path that is a file of `src/` (a module's own children, named without a
//! prefix, are its parts and not edges). The binary (`src/bin/`) is a user of the library and is
//! left out. The test prints every cycle with the edges that make it.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

type Module = Vec<String>;

/// Every `.rs` file under `dir` except `src/bin/`.
fn source_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if path.file_name().unwrap() != "bin" {
                source_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file (`src/rerank/ssr/graph.rs` → `rerank::ssr::graph`; `mod.rs` and
/// `lib.rs` name their folder).
fn module_of(file: &Path, src: &Path) -> Module {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Module = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// The code of a file without line comments and without its `#[cfg(test)]` modules.
fn code_of(text: &str) -> String {
    let mut out = String::new();
    let mut skipping_tests = false;
    let mut depth = 0i64;
    let mut pending_cfg_test = false;
    for line in text.lines() {
        let code = match line.find("//") {
            // `://` inside a string (a URL) is not a comment.
            Some(i) if !line[..i].ends_with(':') => &line[..i],
            _ => line,
        };
        let trimmed = code.trim();
        if skipping_tests {
            depth += code.matches('{').count() as i64 - code.matches('}').count() as i64;
            if depth <= 0 {
                skipping_tests = false;
            }
            continue;
        }
        if trimmed == "#[cfg(test)]" {
            pending_cfg_test = true;
            continue;
        }
        if pending_cfg_test && trimmed.starts_with("mod ") && trimmed.ends_with('{') {
            skipping_tests = true;
            depth = 1;
            pending_cfg_test = false;
            continue;
        }
        pending_cfg_test = false;
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// The paths a piece of code names after `prefix` (`crate::` or `super::`), with `use` groups
/// (`a::{b, c::d}`) expanded one level: `["a", "b"]`, `["a", "c", "d"]`.
fn paths_after(code: &str, prefix: &str) -> Vec<Module> {
    let mut paths = Vec::new();
    let bytes = code.as_bytes();
    let mut start = 0;
    while let Some(i) = code[start..].find(prefix) {
        let at = start + i;
        start = at + prefix.len();
        // A whole word: not `foo_crate::` or `my_super::`.
        if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_') {
            continue;
        }
        let rest = &code[start..];
        let head_len = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(rest.len());
        let head: Module = rest[..head_len]
            .split("::")
            .filter(|p| !p.is_empty())
            .map(str::to_owned)
            .collect();
        if rest[head_len..].starts_with('{') {
            let group = &rest[head_len + 1..];
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    _ => {}
                }
                if c == ',' && depth == 0 {
                    paths.push(join(&head, &item));
                    item.clear();
                } else {
                    item.push(c);
                }
            }
            paths.push(join(&head, &item));
        } else {
            paths.push(head);
        }
    }
    paths
}

fn join(head: &Module, item: &str) -> Module {
    let item = item.trim();
    let name_len = item
        .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(item.len());
    let mut path = head.clone();
    path.extend(
        item[..name_len]
            .split("::")
            .filter(|p| !p.is_empty() && *p != "self")
            .map(str::to_owned),
    );
    path
}

/// The import graph of the files of `src/`: file module → the file modules it names.
fn import_graph(src: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut files = Vec::new();
    source_files(src, &mut files);
    let modules: BTreeMap<Module, PathBuf> = files
        .iter()
        .map(|f| (module_of(f, src), f.clone()))
        .collect();
    let resolve = |path: &[String]| -> Option<Module> {
        (1..=path.len())
            .rev()
            .map(|n| path[..n].to_vec())
            .find(|m| modules.contains_key(m))
    };
    let mut graph = BTreeMap::new();
    for (module, file) in &modules {
        let code = code_of(&fs::read_to_string(file).unwrap());
        let mut targets = BTreeSet::new();
        for path in paths_after(&code, "crate::") {
            targets.extend(resolve(&path));
        }
        let parent = &module[..module.len().saturating_sub(1)];
        for path in paths_after(&code, "super::") {
            let mut full = parent.to_vec();
            full.extend(path);
            targets.extend(resolve(&full));
        }
        targets.remove(module);
        graph.insert(module.clone(), targets);
    }
    graph
}

/// The strongly connected components with more than one node (Tarjan's algorithm).
fn cycles<N: Ord + Clone>(graph: &BTreeMap<N, BTreeSet<N>>) -> Vec<Vec<N>> {
    struct State<N> {
        index: BTreeMap<N, usize>,
        low: BTreeMap<N, usize>,
        stack: Vec<N>,
        on_stack: BTreeSet<N>,
        found: Vec<Vec<N>>,
    }
    fn visit<N: Ord + Clone>(v: &N, g: &BTreeMap<N, BTreeSet<N>>, s: &mut State<N>) {
        let i = s.index.len();
        s.index.insert(v.clone(), i);
        s.low.insert(v.clone(), i);
        s.stack.push(v.clone());
        s.on_stack.insert(v.clone());
        for w in g.get(v).into_iter().flatten() {
            if !s.index.contains_key(w) {
                visit(w, g, s);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v.clone(), low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v.clone(), low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on_stack.remove(&w);
                component.push(w.clone());
                if &w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.found.push(component);
            }
        }
    }
    let mut state = State {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !state.index.contains_key(v) {
            visit(v, graph, &mut state);
        }
    }
    state.found
}

fn name(m: &Module) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

/// The edges of `graph` inside each cycle, one per line.
fn describe<N: Ord + Clone>(
    found: &[Vec<N>],
    edges: &[(Module, Module)],
    key: impl Fn(&Module) -> N,
) -> String {
    let mut text = String::new();
    for component in found {
        let inside: BTreeSet<&N> = component.iter().collect();
        for (a, b) in edges {
            let (ka, kb) = (key(a), key(b));
            if ka != kb && inside.contains(&ka) && inside.contains(&kb) {
                text.push_str(&format!("  {} -> {}\n", name(a), name(b)));
            }
        }
        text.push('\n');
    }
    text
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every edge of a graph, as pairs.
fn edges_of(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<(Module, Module)> {
    graph
        .iter()
        .flat_map(|(a, bs)| bs.iter().map(move |b| (a.clone(), b.clone())))
        .collect()
}

#[test]
fn top_level_modules_import_each_other_one_way_only() {
    let edges = edges_of(&import_graph(&src()));
    let top = |m: &Module| m.first().cloned().unwrap_or_default();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (a, b) in &edges {
        // The crate root (`lib.rs`) declares every module and is not a layer.
        if !a.is_empty() && !b.is_empty() && top(a) != top(b) {
            graph.entry(top(a)).or_default().insert(top(b));
        }
    }
    let found = cycles(&graph);
    assert!(
        found.is_empty(),
        "top-level modules that import each other: {found:?}\n{}",
        describe(&found, &edges, top)
    );
    // The check sees the graph: the layers it protects are there.
    assert!(graph["train"].contains("data") && graph["rerank"].contains("fewshot"));
}

/// The layer table of a Markdown or doc-comment text: `| <n> | <modules> | …` rows, module names
/// read from the second cell (bare or as `` [`name`] `` links).
fn layer_table(text: &str) -> BTreeMap<String, usize> {
    let mut layers = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim_start_matches("//!").trim();
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (Some(layer), Some(modules)) = (cells.get(1), cells.get(2)) else {
            continue;
        };
        let Ok(layer) = layer.parse::<usize>() else {
            continue;
        };
        for name in modules.split(',') {
            let name = name.trim().trim_start_matches("[`").trim_end_matches("`]");
            layers.insert(name.to_string(), layer);
        }
    }
    layers
}

#[test]
fn modules_use_only_the_layers_above_them_as_architecture_md_says() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = fs::read_to_string(src().join("lib.rs")).unwrap();
    let doc = fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let layers = layer_table(&lib);
    // ARCHITECTURE.md and the crate documentation give the same layers, and every public
    // module of the crate has one.
    assert_eq!(
        layer_table(&doc),
        layers,
        "ARCHITECTURE.md and src/lib.rs differ"
    );
    let declared: BTreeSet<String> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("pub mod "))
        .map(|m| m.trim_end_matches(';').to_string())
        .collect();
    assert_eq!(
        declared,
        layers.keys().cloned().collect(),
        "modules without a layer"
    );
    // No import reaches down to a lower layer.
    let mut wrong = Vec::new();
    for (a, b) in edges_of(&import_graph(&src())) {
        let (Some(from), Some(to)) = (a.first(), b.first()) else {
            continue;
        };
        if let (Some(&la), Some(&lb)) = (layers.get(from), layers.get(to)) {
            if lb > la {
                wrong.push(format!(
                    "{} (layer {la}) → {} (layer {lb})",
                    name(&a),
                    name(&b)
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports of a lower layer:\n{}",
        wrong.join("\n")
    );
    assert_eq!(layers["train"], 4);
}

#[test]
fn files_import_each_other_one_way_only() {
    let graph = import_graph(&src());
    let edges = edges_of(&graph);
    let found = cycles(&graph);
    assert!(
        found.is_empty(),
        "files that import each other: {:?}\n{}",
        found
            .iter()
            .map(|c| c.iter().map(name).collect::<Vec<_>>())
            .collect::<Vec<_>>(),
        describe(&found, &edges, Clone::clone)
    );
}

#[test]
fn the_reader_finds_paths_and_cycles() {
    let code = code_of(
        "use crate::a::{b, c::{D, E}};\n// crate::ignored::x\nlet x = super::f::g();\n\
         #[cfg(test)]\nmod tests {\n    use crate::t::u;\n}\n",
    );
    assert_eq!(
        paths_after(&code, "crate::"),
        vec![
            vec!["a".to_string(), "b".into()],
            vec!["a".into(), "c".into()]
        ]
    );
    assert_eq!(
        paths_after(&code, "super::"),
        vec![vec!["f".to_string(), "g".into()]]
    );
    let mut g: BTreeMap<u8, BTreeSet<u8>> = BTreeMap::new();
    g.insert(1, [2].into());
    g.insert(2, [3].into());
    g.insert(3, [1].into());
    g.insert(4, [1].into());
    assert_eq!(cycles(&g), vec![vec![1, 2, 3]]);
    g.insert(3, BTreeSet::new());
    assert!(cycles(&g).is_empty());
}
