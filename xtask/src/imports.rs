//! The import graph of every crate, for tidy: no two modules may use each other, directly
//! or around a cycle, so that each layer uses only the ones below it.
//!
//! Names: a *module* is a path from its crate's root (`backend::index`); a module's
//! *siblings* are the modules declared next to it. Every `crate::…`, `super::…` and
//! `self::…` path of a file (in `use` items and in code) is resolved to the deepest module
//! it names; a path into a sibling (or anything below it) is an edge between the two
//! siblings. A module using its parent or its own children is no edge: a parent is the face
//! of its children (`mod.rs` re-exports them). Re-exports are not followed, and paths inside
//! macro calls are not seen.

use std::collections::{BTreeMap, BTreeSet};

use syn::visit::Visit;

/// A module path from its crate's root: empty for the root.
type Module = Vec<String>;

/// The module a source file is, relative to its crate's `src/`: `lib.rs` and `main.rs` are
/// the root, `a/mod.rs` is `a`, `a/b.rs` is `a::b`.
fn module_of(relative: &str) -> Module {
    let mut parts: Vec<String> = relative.trim_end_matches(".rs").split('/').map(String::from).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    parts
}

/// Collects the `crate::`/`super::`/`self::` paths of a file, as absolute module paths.
struct Paths<'a> {
    here: &'a Module,
    found: Vec<Vec<String>>,
    /// Modules declared `#[cfg(test)] mod name;`, whose files are tests.
    tests: Vec<Module>,
}

impl Paths<'_> {
    fn absolute(&mut self, segments: Vec<String>) {
        let mut it = segments.into_iter().peekable();
        let mut base: Vec<String> = match it.peek().map(String::as_str) {
            Some("crate") => {
                it.next();
                Vec::new()
            }
            Some("self") => {
                it.next();
                self.here.clone()
            }
            Some("super") => {
                let mut base = self.here.clone();
                while it.peek().map(String::as_str) == Some("super") {
                    it.next();
                    base.pop();
                }
                base
            }
            _ => return,
        };
        base.extend(it);
        self.found.push(base);
    }

    /// The paths a `use` tree names, with `prefix` before them.
    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut path = prefix.clone();
                if n.ident != "self" {
                    path.push(n.ident.to_string());
                }
                self.absolute(path);
            }
            syn::UseTree::Rename(r) => {
                let mut path = prefix.clone();
                path.push(r.ident.to_string());
                self.absolute(path);
            }
            syn::UseTree::Glob(_) => self.absolute(prefix.clone()),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t);
                }
            }
        }
    }
}

/// Whether the attributes hold `#[cfg(test)]`: tests may use any module.
fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs
        .iter()
        .any(|a| a.path().is_ident("cfg") && a.parse_args::<syn::Ident>().is_ok_and(|i| i == "test"))
}

impl<'ast> Visit<'ast> for Paths<'_> {
    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        if !is_test(&item.attrs) {
            self.use_tree(&mut Vec::new(), &item.tree);
        }
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        if !is_test(&item.attrs) {
            syn::visit::visit_item_mod(self, item);
        } else if item.content.is_none() {
            let mut module = self.here.clone();
            module.push(item.ident.to_string());
            self.tests.push(module);
        }
    }

    fn visit_item_fn(&mut self, item: &'ast syn::ItemFn) {
        if !is_test(&item.attrs) {
            syn::visit::visit_item_fn(self, item);
        }
    }

    fn visit_item_impl(&mut self, item: &'ast syn::ItemImpl) {
        if !is_test(&item.attrs) {
            syn::visit::visit_item_impl(self, item);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        self.absolute(path.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit::visit_path(self, path);
    }
}

/// The deepest module of `modules` that `path` names (a prefix of it).
fn resolve(path: &[String], modules: &BTreeSet<Module>) -> Module {
    (0..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|m| modules.contains(m))
        .unwrap_or_default()
}

/// The cycles among siblings of one crate, given its files as `(path relative to src/,
/// text)`: each as its modules, e.g. `backend::{frozen, index}`. A file that does not parse
/// is a problem of its own.
pub(crate) fn cycles(files: &[(String, String)]) -> Vec<String> {
    let modules: BTreeSet<Module> = files.iter().map(|(f, _)| module_of(f)).collect();
    // (parent, from, to): `from` and `to` are siblings below `parent`.
    let mut edges: BTreeMap<Module, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    // The first file that made each edge, to name it.
    let mut made_by: BTreeMap<(Module, String, String), &str> = BTreeMap::new();
    let mut problems = Vec::new();
    let mut parsed = Vec::new();
    let mut tests: BTreeSet<Module> = BTreeSet::new();
    for (f, text) in files {
        let here = module_of(f);
        let ast = match syn::parse_file(text) {
            Ok(ast) => ast,
            Err(e) => {
                problems.push(format!("{f} does not parse: {e}"));
                continue;
            }
        };
        let mut paths = Paths {
            here: &here,
            found: Vec::new(),
            tests: Vec::new(),
        };
        paths.visit_file(&ast);
        tests.extend(paths.tests);
        parsed.push((f, here.clone(), paths.found));
    }
    for (f, here, found) in parsed {
        if tests.iter().any(|t| here.starts_with(t)) {
            continue;
        }
        for path in found {
            let to = resolve(&path, &modules);
            let common = here.iter().zip(&to).take_while(|(a, b)| a == b).count();
            // An ancestor or a descendant: no edge.
            if common == here.len() || common == to.len() {
                continue;
            }
            let (parent, from, into) = (here[..common].to_vec(), here[common].clone(), to[common].clone());
            made_by
                .entry((parent.clone(), from.clone(), into.clone()))
                .or_insert(f.as_str());
            edges.entry(parent).or_default().entry(from).or_default().insert(into);
        }
    }
    for (parent, graph) in &edges {
        for cycle in strongly_connected(graph) {
            let at = if parent.is_empty() {
                "crate".to_string()
            } else {
                parent.join("::")
            };
            let mut how = Vec::new();
            for from in &cycle {
                for into in graph[from].iter().filter(|t| cycle.contains(t)) {
                    let file = made_by[&(parent.clone(), from.clone(), into.clone())];
                    how.push(format!("{from} → {into} ({file})"));
                }
            }
            problems.push(format!(
                "{at}::{{{}}} use each other: {}",
                cycle.join(", "),
                how.join(", ")
            ));
        }
    }
    problems
}

/// The strongly connected components of more than one node (Tarjan), each sorted.
fn strongly_connected(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'g> {
        graph: &'g BTreeMap<String, BTreeSet<String>>,
        next: usize,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'g>(s: &mut State<'g>, v: &'g str) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.graph.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.out.push(component);
            }
        }
    }
    let mut s = State {
        graph,
        next: 0,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(f, t)| (f.to_string(), t.to_string())).collect()
    }

    /// Two siblings that use each other — by `use`, by a path in code, through a group or
    /// from below — are a cycle; a module using its parent or its children is none.
    #[test]
    fn a_cycle_among_siblings_is_found_and_nothing_else() {
        let layered = files(&[
            ("lib.rs", "mod a; mod b; pub use a::X;"),
            ("a/mod.rs", "mod inner; pub struct X; fn f() { crate::b::y(); }"),
            ("a/inner.rs", "use super::X; use crate::a::X as Y;"),
            ("b.rs", "pub fn y() {} use crate::Root;"),
        ]);
        assert!(cycles(&layered).is_empty(), "{:?}", cycles(&layered));
        let cyclic = files(&[
            ("lib.rs", "mod a; mod b; mod c;"),
            ("a/mod.rs", "mod inner;"),
            ("a/inner.rs", "use crate::{b::{self, Y}};"),
            ("b.rs", "fn f() -> super::c::Z { todo!() }"),
            ("c.rs", "use crate::a::inner::W;"),
        ]);
        assert_eq!(
            cycles(&cyclic),
            ["crate::{a, b, c} use each other: a → b (a/inner.rs), b → c (b.rs), c → a (c.rs)"]
        );
        // Tests may use anything.
        let tested = files(&[
            ("lib.rs", "mod a; mod b;"),
            ("a.rs", "use crate::b::Y;"),
            (
                "b.rs",
                "#[cfg(test)] mod tests { use crate::a::X; } #[cfg(test)] use crate::a::Z;",
            ),
        ]);
        assert!(cycles(&tested).is_empty(), "{:?}", cycles(&tested));
    }
}
