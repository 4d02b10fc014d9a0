//! No import cycle between the files of a library crate (padll-wire, padll-stage,
//! policies, cheferd-controller): what a file uses from another file of its crate is
//! below it, so each file can be read, changed and tested knowing only what it uses.
//!
//! The graph is built from the source text. Its nodes are the module files reached from
//! `src/lib.rs` through `mod x;` (a `mod.rs` is its directory's module; inline `mod x {
//! … }` belong to their file). Its edges are path references to another file of the
//! crate: `crate::`, `super::`, `self::`, `$crate::` and paths starting with a child
//! module's name, in `use` declarations (groups `use crate::{a, b::{c}}` included) and
//! inline (`crate::x::y(…)`). A path leads to the file that holds what it names: that of
//! the deepest module it names, through the `use` imports and re-exports (`as` names
//! included) of that module, so `super::sibling::Item` is an edge to `sibling.rs`, and
//! `super::Item` one to the parent's file, or to the file the parent imports `Item` from:
//! a re-export hides no cycle. A `mod x;` declaration is not an edge. Comments, string
//! literals and `pub(in …)` are not references. Unit tests are left out: `#[cfg(test)]
//! mod …` (inline or a file) and files named `tests.rs`.
//!
//! Cycles are looked for among siblings: the files and directories of one directory (the
//! crate's `src/` first), a directory standing for every file below it. An edge between
//! two files is one between the siblings that hold them, so `local/stage.rs → usage.rs →
//! local/mod.rs` is the cycle `local/ ↔ usage.rs`. Edges between a module and its own
//! descendants (`super::State`, a parent's `pub use child::Item`) are inside one sibling:
//! a child module is part of its parent (it sees the parent's private items), and a type
//! a parent defines and its children extend with `impl` blocks is one concept.

use super::tidy::CRATES;
use crate::util::repository;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// A module's path from its crate's root (`["global", "registry"]`).
type ModulePath = Vec<String>;

/// The file-level dependency graph of one crate, files named relative to its `src/`.
#[derive(Debug, Default)]
struct FileGraph {
    /// Each file's module.
    modules: BTreeMap<String, ModulePath>,
    /// For each file, the files it references, each with one path that references it.
    edges: Graph,
}

/// For each node, the nodes it references, each with why.
type Graph = BTreeMap<String, BTreeMap<String, String>>;

/// For each module, the names its `use` declarations bring in, with the paths (from the
/// crate's root) they name.
type Imports = BTreeMap<ModulePath, BTreeMap<String, ModulePath>>;

/// A crate's modules: for each module path (and each `#[macro_export]` macro, which
/// lives at the crate's root), the file that holds it.
type Modules = BTreeMap<ModulePath, String>;

/// One file's declarations and references, with the inline module (relative to the
/// file's module) each was found in.
#[derive(Debug, Default)]
struct FileScan {
    /// `mod x;` (`inline: false`) and `mod x { … }` declarations.
    mods: Vec<ModDecl>,
    /// `#[macro_export] macro_rules! name`.
    exported_macros: Vec<String>,
    /// Paths of two or more segments as written, with a trailing `*` for globs.
    paths: Vec<(ModulePath, Vec<String>)>,
    /// The names `use` declarations bring in (`as` names included), with their paths.
    imports: Vec<(ModulePath, String, Vec<String>)>,
}

#[derive(Debug)]
struct ModDecl {
    scope: ModulePath,
    name: String,
    inline: bool,
}

/// The crate whose `src/` files `read` returns (by path relative to `src/`, `None` if
/// there is no such file), from `lib.rs`.
fn file_graph(read: impl Fn(&str) -> Option<String>) -> FileGraph {
    let mut modules = Modules::new();
    let mut scans = BTreeMap::new();
    let mut queue = VecDeque::from([("lib.rs".to_string(), ModulePath::new())]);
    while let Some((file, module)) = queue.pop_front() {
        let text = read(&file).unwrap_or_else(|| panic!("no source file {file}"));
        let scan = scan(&tokens(&text));
        modules.insert(module.clone(), file.clone());
        for name in &scan.exported_macros {
            modules.insert(vec![name.clone()], file.clone());
        }
        for decl in &scan.mods {
            let path = [
                module.as_slice(),
                &decl.scope,
                std::slice::from_ref(&decl.name),
            ]
            .concat();
            if decl.inline {
                modules.insert(path, file.clone());
                continue;
            }
            let dir = [module_dir(&file).as_slice(), &decl.scope]
                .concat()
                .join("/");
            let prefix = if dir.is_empty() { dir } else { dir + "/" };
            let candidates = [
                format!("{prefix}{}.rs", decl.name),
                format!("{prefix}{}/mod.rs", decl.name),
            ];
            let child = candidates
                .into_iter()
                .find(|c| read(c).is_some())
                .unwrap_or_else(|| panic!("{file} declares `mod {};` with no file", decl.name));
            if child.rsplit('/').next() != Some("tests.rs") {
                queue.push_back((child, path));
            }
        }
        scans.insert(file, (module, scan));
    }
    let mut imports = Imports::new();
    for (module, scan) in scans.values() {
        for (scope, name, path) in &scan.imports {
            let here = [module.as_slice(), scope].concat();
            if let Some(absolute) = absolute(&here, path, &modules) {
                imports
                    .entry(here)
                    .or_default()
                    .insert(name.clone(), absolute);
            }
        }
    }
    let mut graph = FileGraph::default();
    for (file, (module, scan)) in &scans {
        graph.modules.insert(file.clone(), module.clone());
        let edges = graph.edges.entry(file.clone()).or_default();
        for (scope, path) in &scan.paths {
            let here = [module.as_slice(), scope].concat();
            let Some(absolute) = absolute(&here, path, &modules) else {
                continue;
            };
            let target = defining_file(&absolute, &modules, &imports);
            if target != file {
                let shown = ["crate"]
                    .into_iter()
                    .chain(absolute.iter().map(String::as_str));
                edges
                    .entry(target.clone())
                    .or_insert_with(|| shown.collect::<Vec<_>>().join("::"));
            }
        }
    }
    graph
}

/// The file that holds what `path` (from the crate's root) names: that of the deepest
/// module it names, or, where that module imports the next segment by `use` (a
/// re-export, or a name its children reach through `super::`), that of the import.
fn defining_file<'a>(path: &[String], modules: &'a Modules, imports: &Imports) -> &'a String {
    let mut path = path.to_vec();
    // Imports cannot loop in a crate that compiles; the bound keeps a broken one finite.
    for _ in 0..32 {
        let depth = (0..=path.len())
            .rev()
            .find(|n| modules.contains_key(&path[..*n]))
            .expect("the crate's root is a module");
        let imported = path
            .get(depth)
            .and_then(|name| imports.get(&path[..depth])?.get(name));
        match imported {
            Some(imported) => path = [imported.as_slice(), &path[depth + 1..]].concat(),
            None => return &modules[&path[..depth]],
        }
    }
    panic!("the imports of {path:?} loop")
}

/// The directory (segments below `src/`) where the children of `file`'s module live.
fn module_dir(file: &str) -> Vec<String> {
    let mut segments: Vec<String> = file.split('/').map(str::to_string).collect();
    let name = segments.pop().expect("a file name");
    match name.strip_suffix(".rs") {
        Some("lib" | "mod") => {}
        Some(stem) => segments.push(stem.to_string()),
        None => panic!("{file} is not a Rust file"),
    }
    segments
}

/// `path`, written in module `here`, from the crate's root; `None` if it does not start
/// in this crate.
fn absolute(here: &[String], path: &[String], modules: &Modules) -> Option<ModulePath> {
    let (first, rest) = path.split_first()?;
    let mut base = match first.as_str() {
        "crate" | "$crate" => return Some(rest.to_vec()),
        "self" => here.to_vec(),
        "super" => here[..here.len().checked_sub(1)?].to_vec(),
        child => {
            let child_path = [here, &[child.to_string()]].concat();
            return modules
                .contains_key(&child_path)
                .then(|| [child_path, rest.to_vec()].concat());
        }
    };
    let mut rest = rest;
    while let Some(("super", tail)) = rest.split_first().map(|(s, t)| (s.as_str(), t)) {
        base.pop()?;
        rest = tail;
    }
    Some([base, rest.to_vec()].concat())
}

/// The file's tokens: identifiers, `::` and single punctuation characters; comments
/// dropped; every literal one `"` token (so neither is read as a path).
fn tokens(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    let ident_char = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            loop {
                match (at(i), at(i + 1)) {
                    ('/', '*') => (depth, i) = (depth + 1, i + 2),
                    ('*', '/') => (depth, i) = (depth - 1, i + 2),
                    ('\0', _) => break,
                    _ => i += 1,
                }
                if depth == 0 {
                    break;
                }
            }
        } else if let Some(end) = raw_string_end(&chars, i) {
            out.push("\"".to_string());
            i = end;
        } else if c == '"' || (matches!(c, 'b' | 'c') && at(i + 1) == '"') {
            i += if c == '"' { 1 } else { 2 };
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            out.push("\"".to_string());
            i += 1;
        } else if c == '\'' || (c == 'b' && at(i + 1) == '\'') {
            // A character literal, or a lifetime (`'a`, no closing quote after one character).
            let start = if c == 'b' { i + 1 } else { i };
            if at(start + 1) == '\\' {
                i = start + 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
                out.push("\"".to_string());
            } else if at(start + 2) == '\'' {
                i = start + 3;
                out.push("\"".to_string());
            } else {
                i = start + 1;
                while ident_char(at(i)) {
                    i += 1;
                }
            }
        } else if ident_char(c) || (c == '$' && ident_char(at(i + 1))) {
            let start = i;
            i += 1;
            while ident_char(at(i)) {
                i += 1;
            }
            out.push(chars[start..i].iter().collect());
        } else if c == ':' && at(i + 1) == ':' {
            out.push("::".to_string());
            i += 2;
        } else {
            out.push(c.to_string());
            i += 1;
        }
    }
    out
}

/// Where a raw (byte/C) string literal starting at `i` ends, if one does.
fn raw_string_end(chars: &[char], i: usize) -> Option<usize> {
    let preceded_by_ident = i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
    let mut j = i;
    if matches!(chars.get(j), Some('b' | 'c')) {
        j += 1;
    }
    if preceded_by_ident || chars.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let hashes = chars[j..].iter().take_while(|c| **c == '#').count();
    j += hashes;
    if chars.get(j) != Some(&'"') {
        return None;
    }
    let closing: Vec<char> = std::iter::once('"')
        .chain(std::iter::repeat_n('#', hashes))
        .collect();
    (j + 1..chars.len())
        .find(|k| chars[*k..].starts_with(&closing))
        .map(|k| k + closing.len())
}

/// The declarations and references in a file's tokens, leaving out `#[cfg(test)]` modules.
fn scan(tokens: &[String]) -> FileScan {
    let mut scan = FileScan::default();
    // The inline modules the scan is in, each with the brace depth inside it.
    let mut scope: Vec<(String, usize)> = Vec::new();
    let mut depth = 0;
    let mut i = 0;
    let scope_path = |scope: &[(String, usize)]| scope.iter().map(|(n, _)| n.clone()).collect();
    while i < tokens.len() {
        let token = tokens[i].as_str();
        let next = |n: usize| tokens.get(i + n).map(String::as_str);
        match token {
            "{" => depth += 1,
            "}" => {
                if scope.last().is_some_and(|(_, d)| *d == depth) {
                    scope.pop();
                }
                depth -= 1;
            }
            "mod" if next(1).is_some_and(is_ident) => {
                let name = tokens[i + 1].clone();
                let inline = next(2) == Some("{");
                let attributes = attributes_before(tokens, i);
                // Test modules, and files shared from `scripts/` (`#[path = …]`), which
                // import nothing of the crate that includes them, are not followed.
                if attributes
                    .iter()
                    .any(|a| a == "cfg(test)" || a.starts_with("path="))
                {
                    i = if inline {
                        closing_brace(tokens, i + 2)
                    } else {
                        i + 2
                    };
                    continue;
                }
                scan.mods.push(ModDecl {
                    scope: scope_path(&scope),
                    name: name.clone(),
                    inline,
                });
                if inline {
                    depth += 1;
                    scope.push((name, depth));
                }
                i += 3;
                continue;
            }
            "macro_rules"
                if next(1) == Some("!")
                    && next(2).is_some_and(is_ident)
                    && attributes_before(tokens, i).contains(&"macro_export".to_string()) =>
            {
                scan.exported_macros.push(tokens[i + 2].clone());
            }
            // `pub(in crate::x)` restricts who sees an item; it uses nothing.
            "in" if i >= 2 && tokens[i - 2] == "pub" => {
                i += 1;
                while tokens.get(i).is_some_and(|t| is_ident(t) || t == "::") {
                    i += 1;
                }
                continue;
            }
            _ if is_ident(token) && (i == 0 || tokens[i - 1] != "::") => {
                let mut paths = Vec::new();
                let end = use_tree(tokens, i, Vec::new(), &mut paths);
                let here: ModulePath = scope_path(&scope);
                let in_use = i > 0 && tokens[i - 1] == "use";
                for (path, alias) in paths.into_iter().filter(|(p, _)| p.len() > 1) {
                    let name = alias.or_else(|| path.last().cloned()).unwrap_or_default();
                    if in_use && is_ident(&name) && name != "_" {
                        scan.imports.push((here.clone(), name, path.clone()));
                    }
                    scan.paths.push((here.clone(), path));
                }
                i = end;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    scan
}

fn is_ident(token: &str) -> bool {
    token.starts_with(|c: char| c.is_alphabetic() || c == '_' || c == '$')
}

/// Reads the path (with `::{…}` groups, `::*` and `as` names) starting at `i`, each full
/// path appended to `out` after `prefix` with its `as` name; returns where it ends.
fn use_tree(
    tokens: &[String],
    mut i: usize,
    prefix: Vec<String>,
    out: &mut Vec<(Vec<String>, Option<String>)>,
) -> usize {
    let mut path = prefix;
    loop {
        match tokens.get(i).map(String::as_str) {
            // `{self, …}` names the group's prefix itself.
            Some("self") if !path.is_empty() => i += 1,
            Some(t) if is_ident(t) || t == "*" => {
                path.push(t.to_string());
                i += 1;
            }
            Some("{") => {
                i += 1;
                while tokens.get(i).is_some_and(|t| t != "}") {
                    i = use_tree(tokens, i, path.clone(), out);
                    if tokens.get(i).is_some_and(|t| t == ",") {
                        i += 1;
                    }
                }
                return i + 1;
            }
            _ => break,
        }
        if tokens.get(i).is_some_and(|t| t == "::") {
            i += 1;
        } else {
            break;
        }
    }
    // `as name` where a use tree ends (not a cast to a type path: `x as crate::T`).
    let alias = match tokens.get(i..i + 3) {
        Some([r#as, name, end]) if r#as == "as" && matches!(end.as_str(), "," | "}" | ";") => {
            i += 2;
            Some(name.clone())
        }
        _ => None,
    };
    out.push((path, alias));
    i
}

/// The attributes (`cfg(test)`, `macro_export`, …) written before the item whose keyword
/// (`mod`, `macro_rules`) is at `i`, past its visibility.
fn attributes_before(tokens: &[String], i: usize) -> Vec<String> {
    let mut i = i;
    if i > 0 && tokens[i - 1] == ")" {
        let open = matching_backwards(tokens, i - 1, "(", ")");
        if open > 0 && tokens[open - 1] == "pub" {
            i = open - 1;
        }
    } else if i > 0 && tokens[i - 1] == "pub" {
        i -= 1;
    }
    let mut attributes = Vec::new();
    while i > 1 && tokens[i - 1] == "]" {
        let open = matching_backwards(tokens, i - 1, "[", "]");
        if open == 0 || tokens[open - 1] != "#" {
            break;
        }
        attributes.push(tokens[open + 1..i - 1].concat());
        i = open - 1;
    }
    attributes
}

/// The index of the `open` matching the `close` at `i`.
fn matching_backwards(tokens: &[String], i: usize, open: &str, close: &str) -> usize {
    let mut depth = 0;
    for j in (0..=i).rev() {
        if tokens[j] == close {
            depth += 1;
        } else if tokens[j] == open {
            depth -= 1;
            if depth == 0 {
                return j;
            }
        }
    }
    0
}

/// The index after the `}` matching the `{` at `i`.
fn closing_brace(tokens: &[String], i: usize) -> usize {
    let mut depth = 0;
    for (j, token) in tokens.iter().enumerate().skip(i) {
        match token.as_str() {
            "{" => depth += 1,
            "}" if depth == 1 => return j + 1,
            "}" => depth -= 1,
            _ => {}
        }
    }
    tokens.len()
}

/// The edges between siblings (files and directories of one directory, a directory
/// written `dir/`) that the edges between files make, each with the file and the path
/// behind it.
fn sibling_graph(files: &FileGraph) -> Graph {
    let file_of: BTreeMap<&ModulePath, &String> = files
        .modules
        .iter()
        .map(|(file, module)| (module, file))
        .collect();
    let name = |module: &[String]| {
        let file = file_of[&module.to_vec()];
        match file.strip_suffix("mod.rs") {
            Some(dir) => dir.to_string(),
            None => file.clone(),
        }
    };
    let mut graph = Graph::new();
    for (from, targets) in &files.edges {
        for (to, path) in targets {
            let (a, b) = (&files.modules[from], &files.modules[to]);
            let common = a.iter().zip(b).take_while(|(x, y)| x == y).count();
            if common == a.len() || common == b.len() {
                continue; // a module and its descendants
            }
            graph
                .entry(name(&a[..=common]))
                .or_default()
                .entry(name(&b[..=common]))
                .or_insert_with(|| format!("{from}: {path}"));
        }
    }
    graph
}

/// Every cycle of the graph, one per strongly connected set of nodes, each written as
/// `a.rs → b.rs (a.rs: crate::b::Item) → a.rs (b.rs: crate::a::Other)`, then the set's
/// other nodes.
fn cycles(graph: &Graph) -> Vec<String> {
    let reaches = |from: &str| {
        let mut seen = BTreeSet::from([from.to_string()]);
        let mut queue = VecDeque::from([from.to_string()]);
        while let Some(file) = queue.pop_front() {
            for next in graph.get(&file).into_iter().flat_map(BTreeMap::keys) {
                if seen.insert(next.clone()) {
                    queue.push_back(next.clone());
                }
            }
        }
        seen
    };
    let mut reported: BTreeSet<String> = BTreeSet::new();
    let mut found = Vec::new();
    for file in graph.keys() {
        if reported.contains(file) {
            continue;
        }
        let component: BTreeSet<String> = reaches(file)
            .into_iter()
            .filter(|other| other != file && reaches(other).contains(file))
            .collect();
        if component.is_empty() {
            continue;
        }
        let cycle = shortest_cycle(graph, file);
        let others: Vec<&str> = component
            .iter()
            .map(String::as_str)
            .filter(|other| !cycle.contains(&format!("→ {other} (")))
            .collect();
        found.push(if others.is_empty() {
            cycle
        } else {
            format!("{cycle}; also in cycles with {file}: {}", others.join(", "))
        });
        reported.extend(component);
    }
    found
}

/// The shortest path from `start` back to itself, with the reference behind each step.
fn shortest_cycle(graph: &Graph, start: &str) -> String {
    let mut came_from: BTreeMap<String, String> = BTreeMap::new();
    let mut queue = VecDeque::from([start.to_string()]);
    while let Some(file) = queue.pop_front() {
        for next in graph.get(&file).into_iter().flat_map(BTreeMap::keys) {
            if next == start {
                let mut steps = vec![file.clone()];
                while let Some(previous) = came_from.get(steps.last().expect("a step")) {
                    steps.push(previous.clone());
                }
                steps.reverse();
                steps.push(start.to_string());
                let mut shown = start.to_string();
                for pair in steps.windows(2) {
                    let by = &graph[&pair[0]][&pair[1]];
                    shown += &format!(" → {} ({by})", pair[1]);
                }
                return shown;
            }
            if next != start && !came_from.contains_key(next) {
                came_from.insert(next.clone(), file.clone());
                queue.push_back(next.clone());
            }
        }
    }
    unreachable!("{start} is on a cycle")
}

#[test]
fn no_file_of_a_library_crate_imports_in_a_cycle() {
    let mut found = Vec::new();
    for krate in CRATES {
        let src = repository().join(krate).join("src");
        let files = file_graph(|file| std::fs::read_to_string(src.join(file)).ok());
        found.extend(
            cycles(&sibling_graph(&files))
                .into_iter()
                .map(|c| format!("{krate}/src: {c}")),
        );
    }
    assert!(
        found.is_empty(),
        "import cycles between files (move the shared item to the module that owns it):\n{}",
        found.join("\n")
    );
}

/// The graph of an in-memory crate.
fn graph_of(files: &[(&str, &str)]) -> FileGraph {
    let files: BTreeMap<&str, &str> = files.iter().copied().collect();
    file_graph(|file| files.get(file).map(|text| text.to_string()))
}

#[test]
fn a_cycle_through_a_use_group_and_an_inline_path_is_found_and_named() {
    let files = graph_of(&[
        ("lib.rs", "mod a;\nmod b;\nmod c;"),
        ("a.rs", "use crate::{c::C, b::{self, B}};\npub struct A;"),
        (
            "b.rs",
            "pub struct B;\npub fn make() -> u32 { crate::a::A; 1 }",
        ),
        ("c.rs", "pub struct C;"),
    ]);
    assert_eq!(
        cycles(&sibling_graph(&files)),
        ["a.rs → b.rs (a.rs: crate::b) → a.rs (b.rs: crate::a::A)"]
    );
}

#[test]
fn a_directory_is_one_sibling_and_its_files_siblings_of_each_other_but_not_of_their_parent() {
    let files = graph_of(&[
        ("lib.rs", "pub mod net;\npub mod app;"),
        (
            "net/mod.rs",
            "mod conn;\nmod wire;\npub use conn::Conn;\npub const LIMIT: u32 = 1;",
        ),
        (
            "net/conn.rs",
            "use super::wire::Frame;\npub struct Conn;\nfn f() -> u32 { crate::app::run(super::LIMIT) }",
        ),
        ("net/wire.rs", "pub struct Frame(super::conn::Conn);"),
        ("app.rs", "pub fn run(_: u32) -> u32 { 1 }\npub fn f(_: crate::net::Conn) {}"),
    ]);
    assert_eq!(
        files.edges["net/conn.rs"]["net/mod.rs"],
        "crate::net::LIMIT"
    );
    assert_eq!(
        cycles(&sibling_graph(&files)),
        [
            "app.rs → net/ (app.rs: crate::net::Conn) → app.rs (net/conn.rs: crate::app::run)",
            "net/conn.rs → net/wire.rs (net/conn.rs: crate::net::wire::Frame) → net/conn.rs \
             (net/wire.rs: crate::net::conn::Conn)"
        ]
    );
}

#[test]
fn a_cycle_through_re_exports_and_as_names_is_found_at_the_files_that_define_the_items() {
    let files = graph_of(&[
        ("lib.rs", "pub mod net;"),
        (
            "net/mod.rs",
            "mod conn;\nmod wire;\npub use wire::Frame;\nuse conn::{Conn as Link};",
        ),
        ("net/conn.rs", "use super::Frame;\npub struct Conn;"),
        (
            "net/wire.rs",
            "pub struct Frame(super::Link, u32);\nconst N: u32 = 1 as u32;",
        ),
    ]);
    assert_eq!(
        cycles(&sibling_graph(&files)),
        [
            "net/conn.rs → net/wire.rs (net/conn.rs: crate::net::Frame) → net/conn.rs \
          (net/wire.rs: crate::net::Link)"
        ]
    );
}

#[test]
fn a_graph_without_cycles_passes_and_tests_comments_and_strings_are_not_references() {
    let graph = graph_of(&[
        ("lib.rs", "pub mod a;\npub mod b;\n#[macro_export]\nmacro_rules! m { () => { $crate::b::B } }"),
        (
            "a.rs",
            "use crate::b::B;\n// crate::lib_uses::a\npub fn f() -> B { crate::m!() }\n\
             #[cfg(test)]\nmod tests { use crate::c::C; }",
        ),
        (
            "b.rs",
            "pub struct B;\n/// [`crate::a::f`]\nconst S: &str = \"crate::a::f\";\n\
             const R: &str = r#\"crate::a::f\"#;\nconst L: char = '\"';\npub(in crate::a) fn g<'a>() {}\n\
             #[cfg(test)]\nmod tests;",
        ),
        ("b/tests.rs", "use crate::a::f;"),
    ]);
    assert_eq!(cycles(&sibling_graph(&graph)), Vec::<String>::new());
    assert_eq!(
        graph.edges["a.rs"].keys().collect::<Vec<_>>(),
        ["b.rs", "lib.rs"]
    );
    assert!(graph.edges["b.rs"].is_empty(), "{:?}", graph.edges["b.rs"]);
}
