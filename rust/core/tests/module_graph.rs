//! The core's module graph, read from its sources (as
//! `tests/core/test_import_graph.py` reads the Python package's): which
//! file's code names which other file's, through `crate::`, `super::`,
//! `self::` and child-module paths (test code left out). The layers of
//! `docs/architecture.md` must hold:
//!
//! - the op families (`ops/`) form no cycle, and no cycle runs through an
//!   op family at all;
//! - `workspace.rs` reaches no op family, reader or db format (the
//!   registries fill themselves from the composition root, `lib.rs` and
//!   `builtins.rs`, which name every family and are left out of the graph);
//! - the cycle through `workspace.rs` is the runtime's, by nature: a
//!   workspace holds nets, a net creates its ops in its workspace, and a
//!   workspace runs plans (`RUNTIME` below); a file joining it fails.
//!
//! (`storage/` and `readers/` each still form a cycle of their own, a
//! package's `mod.rs` and its files; `print_the_cycles` lists them.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The composition root: names every piece, so it is no layer.
const ROOT: &[&str] = &["lib.rs", "builtins.rs"];

/// The runtime's cycle (see the module doc).
const RUNTIME: &[&str] = &[
    "net.rs",
    "operator.rs",
    "plan/execute.rs",
    "plan/mod.rs",
    "workspace.rs",
];

/// A module path (`["ops", "kit"]`) and its file, relative to `src/`.
fn modules(src: &Path) -> BTreeMap<Vec<String>, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            if p.extension().and_then(|e| e.to_str()) != Some("rs") {
                continue;
            }
            let rel = p
                .strip_prefix(src)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            let mut path: Vec<String> = rel
                .trim_end_matches(".rs")
                .split('/')
                .map(String::from)
                .collect();
            if path.last().map(String::as_str) == Some("mod") || rel == "lib.rs" {
                path.pop();
            }
            out.insert(path, rel);
        }
    }
    out
}

/// The source without comments, string literals and `#[cfg(test)]` items
/// (test modules inline or in their own file).
fn code(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            i += 2;
            while i + 1 < b.len() && !b[i..].starts_with(b"*/") {
                i += 1;
            }
            i += 2;
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && i + 2 < b.len() && (b[i + 2] == b'\'' || b[i + 1] == b'\\') {
            // A char literal ('{', '\n'); lifetimes have no closing quote.
            i += 1;
            while i < b.len() && b[i] != b'\'' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
        } else if b[i..].starts_with(b"#[cfg(test)]") {
            // Skip the item: up to its `;` or its balanced braces.
            i += b"#[cfg(test)]".len();
            let mut depth = 0;
            while i < b.len() {
                match b[i] {
                    b'{' => depth += 1,
                    b'}' => {
                        depth -= 1;
                        if depth == 0 {
                            i += 1;
                            break;
                        }
                    }
                    b';' if depth == 0 => {
                        i += 1;
                        break;
                    }
                    _ => {}
                }
                i += 1;
            }
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

/// The files declared under `#[cfg(test)]` (`mod tests;`, `mod test_util;`).
fn test_files(mods: &BTreeMap<Vec<String>, String>, src: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (path, file) in mods {
        let text = std::fs::read_to_string(src.join(file)).unwrap();
        let mut lines = text.lines().peekable();
        while let Some(l) = lines.next() {
            if l.trim() == "#[cfg(test)]" {
                if let Some(next) = lines.peek() {
                    let n = next
                        .trim()
                        .trim_start_matches("pub ")
                        .trim_start_matches("pub(crate) ");
                    if let Some(name) = n.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
                        let mut child = path.clone();
                        child.push(name.to_string());
                        if let Some(f) = mods.get(&child) {
                            out.insert(f.clone());
                        }
                    }
                }
            }
        }
    }
    out
}

/// Each file's edges to the files whose items its code names.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mods = modules(src);
    let tests = test_files(&mods, src);
    let by_file: BTreeMap<&String, &Vec<String>> = mods.iter().map(|(p, f)| (f, p)).collect();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut g = BTreeMap::new();
    for (file, path) in &by_file {
        if tests.contains(*file) {
            continue;
        }
        let text = code(&std::fs::read_to_string(src.join(file)).unwrap());
        let b = text.as_bytes();
        // Inline modules (`mod x86 { ... }`) shift what `super` means.
        let mut inline: Vec<(String, i32)> = Vec::new();
        let mut depth = 0i32;
        let mut deps = BTreeSet::new();
        let mut i = 0;
        while i < b.len() {
            let c = b[i];
            if c == b'{' {
                depth += 1;
            } else if c == b'}' {
                depth -= 1;
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
            }
            if !ident(c) || (i > 0 && (ident(b[i - 1]) || b[i - 1] == b'$')) {
                // A `$crate` counts as `crate`.
                if !(c == b'c' && i > 0 && b[i - 1] == b'$') {
                    i += 1;
                    continue;
                }
            }
            // A path: idents joined by `::`, or a `use` group.
            let start = i;
            while i < b.len() && (ident(b[i]) || b[i..].starts_with(b"::")) {
                i += if b[i] == b':' { 2 } else { 1 };
            }
            let word = &text[start..i];
            if word == "mod" {
                let rest = text[i..].trim_start();
                let name: String = rest
                    .bytes()
                    .take_while(|&c| ident(c))
                    .map(|c| c as char)
                    .collect();
                let after = rest[name.len()..].trim_start();
                if after.starts_with('{') {
                    inline.push((name, depth));
                }
                continue;
            }
            let mut segs: Vec<&str> = word.split("::").filter(|s| !s.is_empty()).collect();
            if segs.len() < 2 && !word.ends_with("::") {
                continue;
            }
            // The module this code is in: the file's, plus inline modules.
            let mut here: Vec<String> = (*path).clone();
            here.extend(inline.iter().map(|(n, _)| n.clone()));
            let mut abs: Vec<String> = match segs[0] {
                "crate" => {
                    segs.remove(0);
                    vec![]
                }
                "self" => {
                    segs.remove(0);
                    here.clone()
                }
                "super" => {
                    let mut m = here.clone();
                    while segs.first() == Some(&"super") {
                        segs.remove(0);
                        m.pop();
                    }
                    m
                }
                first => {
                    // A child module of this one (`plan::*`, `kit::FnOp`).
                    let mut child = (*path).clone();
                    child.push(first.to_string());
                    if !mods.contains_key(&child) {
                        continue;
                    }
                    (*path).clone()
                }
            };
            // A `use a::{b, c::d}` group names each member.
            let group: Vec<String> = if text[i..].starts_with('{') {
                let end = text[i..].find('}').map_or(i, |e| i + e);
                text[i + 1..end]
                    .split(',')
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect()
            } else {
                vec![String::new()]
            };
            abs.extend(segs.iter().map(|s| s.to_string()));
            for member in group {
                let mut p = abs.clone();
                p.extend(
                    member
                        .split("::")
                        .filter(|s| !s.is_empty() && *s != "self")
                        .map(|s| s.trim().to_string()),
                );
                // The longest prefix that is a module names the file.
                while !p.is_empty() && !mods.contains_key(&p) {
                    p.pop();
                }
                if let Some(f) = mods.get(&p) {
                    if f != *file && !ROOT.contains(&f.as_str()) && !tests.contains(f) {
                        deps.insert(f.clone());
                    }
                }
            }
        }
        if !ROOT.contains(&file.as_str()) {
            g.insert((*file).clone(), deps);
        }
    }
    g
}

/// The strongly connected components of more than one file (Tarjan's).
fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    struct T<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<BTreeSet<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let n = t.index.len();
        t.index.insert(v, n);
        t.low.insert(v, n);
        t.stack.push(v);
        t.on.insert(v);
        for w in t.g.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !t.g.contains_key(w) {
                continue;
            }
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut scc = BTreeSet::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                scc.insert(w.to_string());
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                t.out.push(scc);
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: vec![],
        on: BTreeSet::new(),
        out: vec![],
    };
    for v in g.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Prints the graph's cycles and sizes (`FERROCAFFE_GRAPH_OF=<a src dir>`
/// reads another tree): `cargo test --test module_graph -- --nocapture
/// print`.
#[test]
fn print_the_cycles() {
    let dir = std::env::var_os("FERROCAFFE_GRAPH_OF").map_or_else(src, PathBuf::from);
    let g = graph(&dir);
    let ops = g.keys().filter(|f| f.starts_with("ops/")).count();
    println!(
        "{} files ({ops} in ops/), {} edges",
        g.len(),
        g.values().map(|d| d.len()).sum::<usize>()
    );
    for scc in cycles(&g) {
        println!("cycle of {} files: {scc:?}", scc.len());
    }
}

#[test]
fn no_cycle_runs_through_an_op_and_workspaces_is_the_runtimes() {
    let g = graph(&src());
    let runtime: BTreeSet<String> = RUNTIME.iter().map(|s| s.to_string()).collect();
    for scc in cycles(&g) {
        assert!(
            !scc.iter().any(|f| f.starts_with("ops/")),
            "a cycle through op families: {scc:?}"
        );
        if scc.contains("workspace.rs") {
            assert_eq!(
                scc, runtime,
                "the cycle through workspace.rs is not the runtime's (workspace, net, operator, plan)"
            );
        }
    }
    assert!(g["ops/unary.rs"].contains("ops/kit.rs"));
}

#[test]
fn workspace_reaches_no_op_family_reader_or_format() {
    let g = graph(&src());
    let mut seen = BTreeSet::new();
    let mut todo = vec!["workspace.rs".to_string()];
    while let Some(f) = todo.pop() {
        if seen.insert(f.clone()) {
            todo.extend(g.get(&f).into_iter().flatten().cloned());
        }
    }
    let reached: Vec<&String> = seen
        .iter()
        .filter(|f| f.starts_with("ops/") || f.starts_with("readers/") || f.starts_with("storage/"))
        .collect();
    assert!(reached.is_empty(), "workspace.rs reaches {reached:?}");
}

/// The graph reader sees what it should: `super` out of an inline module,
/// `use` groups, child-module paths, `$crate` in macros, and not test code.
#[test]
fn the_reader_finds_the_edges_it_should() {
    let g = graph(&src());
    assert!(
        g["ops/gemm/small.rs"].is_empty(),
        "{:?}",
        g["ops/gemm/small.rs"]
    );
    assert!(g["ops/conv/mod.rs"].contains("ops/conv/plan.rs"));
    assert!(g["ops/optim/sgd.rs"].contains("ops/optim/common.rs"));
    assert!(g["ops/loss.rs"].contains("tensor.rs"));
    assert!(!g.contains_key("ops/elementwise/tests.rs") && !g.contains_key("test_util.rs"));
    assert!(
        !g["ops/fill.rs"].contains("workspace.rs"),
        "test code counted"
    );
}
