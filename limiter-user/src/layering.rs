//! The layering tests: no room imports a room listed below it (the list
//! in `lib.rs`), and inside every room, in this crate, `limiter-common`
//! and `limiter-ebpf`, the modules of one folder import one another
//! without a circle. What a test cannot see: an item reached through a
//! parent's `pub use` (the parent is not a sibling).

use std::collections::{BTreeMap, BTreeSet};

/// The rooms in the order `lib.rs` lists them.
fn rooms() -> Vec<String> {
    rooms_of(include_str!("lib.rs"), false)
}

/// The rooms of `lib`'s list (only those marked `(feature)`, if
/// `features`).
fn rooms_of(lib: &str, features: bool) -> Vec<String> {
    lib.lines()
        .filter_map(|l| l.strip_prefix("//! - "))
        .map(|l| l.split(": ").next().unwrap_or_default())
        .filter(|l| !features || l.contains("(feature)"))
        .flat_map(|l| l.split('`').skip(1).step_by(2))
        .map(str::to_owned)
        .collect()
}

/// Every `.rs` file under `path` (or `path` itself), with its text.
fn sources(path: &std::path::Path, out: &mut Vec<(String, String)>) {
    if path.is_dir() {
        for e in std::fs::read_dir(path).unwrap() {
            sources(&e.unwrap().path(), out);
        }
    } else if path.is_file() && path.extension().is_some_and(|x| x == "rs") {
        out.push((path.display().to_string(), std::fs::read_to_string(path).unwrap()));
    }
}

/// The paths a source names from `crate::`, `super::` or `self::`, each
/// group expanded: `use crate::{a::{b::C, d}, e}` names `crate::a::b::C`,
/// `crate::a::d` and `crate::e`. Comments are left out.
fn paths(text: &str) -> Vec<String> {
    let code: String = text.lines().map(|l| l.split("//").next().unwrap_or_default()).collect::<Vec<_>>().join("\n");
    let b = code.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let start = ["crate::", "super::", "self::"].into_iter().find(|k| b[i..].starts_with(k.as_bytes()));
        if start.is_none() || (i > 0 && ident(b[i - 1])) {
            i += 1;
            continue;
        }
        // The path's segments, up to a group or its end.
        let mut j = i;
        while j < b.len() && (ident(b[j]) || b[j..].starts_with(b"::")) && !b[j..].starts_with(b"::{") {
            j += if b[j] == b':' { 2 } else { 1 };
        }
        let base = code[i..j].trim_end_matches("::").to_owned();
        if b[j..].starts_with(b"::{") {
            let group = &code[j + 3..];
            let end = closing(group);
            out.extend(expand(&base, &group[..end]));
            j += 3 + end;
        } else {
            out.push(base);
        }
        i = j.max(i + 1);
    }
    out.retain(|p| !p.ends_with("::"));
    out
}

/// Where the group `text` starts in closes (the index of its `}`, or
/// the end).
fn closing(text: &str) -> usize {
    let mut depth = 0;
    for (at, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => return at,
            '}' => depth -= 1,
            _ => {}
        }
    }
    text.len()
}

/// The paths of a use group's items under `base` (`self` is `base`).
fn expand(base: &str, group: &str) -> Vec<String> {
    let mut items = Vec::new();
    let (mut depth, mut item) = (0, String::new());
    for c in group.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(std::mem::take(&mut item));
                continue;
            }
            _ => {}
        }
        item.push(c);
    }
    items.push(item);
    let mut out = Vec::new();
    for item in items {
        let item: String = item.split_whitespace().collect::<Vec<_>>().join(" ");
        if let Some((head, rest)) = item.split_once("::{") {
            out.extend(expand(&format!("{base}::{head}"), &rest[..closing(rest)]));
        } else {
            let path = item.split(" as ").next().unwrap_or_default().trim();
            match path {
                "" => {}
                "self" | "*" => out.push(base.to_owned()),
                p => out.push(format!("{base}::{p}")),
            }
        }
    }
    out
}

/// A file's module path (`engine/enforcer/deny.rs`: engine, enforcer,
/// deny; `mod.rs`, `lib.rs` and `main.rs` are their folder's).
fn module_of(rel: &str) -> Vec<String> {
    let mut m: Vec<String> = rel.trim_end_matches(".rs").split('/').map(str::to_owned).collect();
    if m.last().is_some_and(|l| ["mod", "lib", "main"].contains(&l.as_str())) {
        m.pop();
    }
    m
}

/// `path` as named from module `from`, made absolute.
fn resolve(from: &[String], path: &str) -> Vec<String> {
    let mut segs = path.split("::").map(str::to_owned).peekable();
    let mut at: Vec<String> = match segs.peek().map(String::as_str) {
        Some("crate") => Vec::new(),
        _ => from.to_vec(),
    };
    for s in segs {
        match s.as_str() {
            "crate" | "self" => {}
            "super" => {
                at.pop();
            }
            _ => at.push(s),
        }
    }
    at
}

/// The circles among sibling modules of `files` (path relative to the
/// crate's `src`, text): each as the modules around it, with the folder.
fn circles(files: &[(String, String)]) -> Vec<(String, Vec<String>)> {
    let modules: Vec<Vec<String>> = files.iter().map(|(rel, _)| module_of(rel)).collect();
    let is_child = |parent: &[String], name: &str| {
        modules.iter().any(|m| m.len() > parent.len() && m.starts_with(parent) && m[parent.len()] == name)
    };
    // Per folder: sibling -> siblings it names.
    let mut edges: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for ((_, text), from) in files.iter().zip(&modules) {
        for p in paths(text) {
            let to = resolve(from, &p);
            let k = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if k < from.len() && k < to.len() && is_child(&from[..k], &to[k]) {
                edges.entry(from[..k].to_vec()).or_default().entry(from[k].clone()).or_default().insert(to[k].clone());
            }
        }
    }
    let mut found = Vec::new();
    for (folder, g) in &edges {
        let reach = |start: &String| {
            let (mut seen, mut stack) = (BTreeSet::new(), vec![start.clone()]);
            while let Some(m) = stack.pop() {
                for n in g.get(&m).into_iter().flatten() {
                    if seen.insert(n.clone()) {
                        stack.push(n.clone());
                    }
                }
            }
            seen
        };
        let reaches: BTreeMap<&String, BTreeSet<String>> = g.keys().map(|m| (m, reach(m))).collect();
        // A circle: the modules that reach `start` and that it reaches,
        // reported once, from its first.
        for (start, from_start) in &reaches {
            let around: Vec<String> =
                from_start.iter().filter(|n| reaches.get(n).is_some_and(|r| r.contains(*start))).cloned().collect();
            if around.first() == Some(*start) {
                found.push((folder.join("/"), around));
            }
        }
    }
    found
}

/// A crate's sources, by path relative to its `src`.
fn crate_sources(name: &str) -> Vec<(String, String)> {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(name).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let prefix = format!("{}/", src.display());
    files.into_iter().map(|(p, t)| (p.strip_prefix(&prefix).unwrap_or(&p).to_owned(), t)).collect()
}

/// The room a module (its path's segments) is in: the longest listed
/// room its path starts with (`upstream::feature` before `upstream`).
fn room_of(rooms: &[String], module: &[String]) -> Option<usize> {
    rooms
        .iter()
        .enumerate()
        .filter(|(_, r)| {
            let segs: Vec<&str> = r.split("::").collect();
            module.len() >= segs.len() && module.iter().zip(&segs).all(|(m, s)| m == s)
        })
        .max_by_key(|(_, r)| r.split("::").count())
        .map(|(i, _)| i)
}

/// The rooms a source of module `from` names (`crate::`, `super::` and
/// `self::` paths alike), by index in `rooms`. A bare parent of `from`
/// (`use super::*` in a file's inline tests, whose `super` the file is)
/// names no room.
fn rooms_named(rooms: &[String], from: &[String], text: &str) -> Vec<usize> {
    paths(text)
        .iter()
        .map(|p| resolve(from, p))
        .filter(|to| !(to.len() < from.len() && from.starts_with(to)))
        .filter_map(|to| room_of(rooms, &to))
        .collect()
}

/// Every source of this crate in a room: (room, path, module, text).
fn sources_by_room(rooms: &[String]) -> Vec<(usize, String, Vec<String>, String)> {
    let mut out = Vec::new();
    for (rel, text) in crate_sources("limiter-user") {
        let module = module_of(&rel);
        if let Some(i) = room_of(rooms, &module) {
            out.push((i, rel, module, text));
        }
    }
    for (i, room) in rooms.iter().enumerate() {
        assert!(out.iter().any(|(j, ..)| *j == i), "room {room} has no source");
    }
    out
}

/// No room imports a room listed below it: the layering `lib.rs`'s list
/// states holds, so no import circle can form between rooms. A room may
/// list one of its modules apart (`upstream::feature`, below the engine
/// its room is above): that module is then a room of its own.
#[test]
fn no_room_imports_one_listed_below_it() {
    let rooms = rooms();
    assert!(rooms.len() >= 15, "{rooms:?}");
    let made_up: Vec<String> = ["control", "policy", "daemon", "policy::feedback"].map(str::to_owned).to_vec();
    let text = "use crate::{\n    control::{A, B},\n    policy::{feedback::X, Y},\n};\nlet y = crate::daemon::Z;\nuse super::W;";
    let from = ["policy".to_owned(), "file".to_owned()];
    assert_eq!(rooms_named(&made_up, &from, text), [0, 0, 3, 1, 2, 1]);
    for (i, path, module, text) in sources_by_room(&rooms) {
        for named in rooms_named(&rooms, &module, &text) {
            assert!(named <= i, "{path} ({}) imports {}, a room listed below it", rooms[i], rooms[named]);
        }
    }
}

/// No feature's room imports another feature's: what two features share
/// is a room above both (`watch`, `nets`), and what ties them together
/// is the daemon's, below them all. A module listed apart is its room's
/// (`upstream::feature` is upstream's).
#[test]
fn no_feature_imports_another() {
    let made_up = "//! - `a`: x;\n//! - `b` (feature): y;\n//! - `c`, `d::e` (feature): z;\n";
    assert_eq!(rooms_of(made_up, true), ["b", "c", "d::e"]);
    let rooms = rooms();
    let feature = |r: &str| r.split("::").next().unwrap_or_default().to_owned();
    let features: Vec<String> = rooms_of(include_str!("lib.rs"), true).iter().map(|r| feature(r)).collect();
    assert!(features.len() >= 7, "{features:?}");
    let mut found = Vec::new();
    for (i, path, module, text) in sources_by_room(&rooms) {
        let own = feature(&rooms[i]);
        if !features.contains(&own) {
            continue;
        }
        for named in rooms_named(&rooms, &module, &text) {
            let other = feature(&rooms[named]);
            if other != own && features.contains(&other) {
                found.push(format!("{path} ({own}) imports {}", rooms[named]));
            }
        }
    }
    assert!(found.is_empty(), "a feature imports another: {found:#?}");
}

/// Inside every room, and in the common and eBPF crates, no module of a
/// folder imports one that imports it back (directly or around).
#[test]
fn no_modules_of_one_folder_import_each_other_in_a_circle() {
    let made_up = |a: &str, b: &str, c: &str| {
        vec![
            ("d/a.rs".to_owned(), a.to_owned()),
            ("d/b.rs".to_owned(), b.to_owned()),
            ("d/c/mod.rs".to_owned(), c.to_owned()),
            ("d/_x.rs".to_owned(), String::new()),
            ("d/mod.rs".to_owned(), "pub use self::a::X;\nuse crate::d::b::Y;".to_owned()),
        ]
    };
    // a -> b -> c -> a: found, with the folder (not _x, which b names
    // but which names none back); a child naming its parent's items is no
    // circle.
    let found = circles(&made_up("use super::b::Y;", "use crate::d::{c::Z, a, _x};", "use super::super::d::a::X;"));
    assert_eq!(found, [("d".to_owned(), vec!["a".to_owned(), "b".to_owned(), "c".to_owned()])]);
    assert!(circles(&made_up("use super::{b::Y, X};", "use super::c::Z;", "use super::W;")).is_empty());
    for name in ["limiter-user", "limiter-common", "limiter-ebpf"] {
        let files = crate_sources(name);
        assert!(files.len() > 10, "{name}: {} files", files.len());
        let mut found = circles(&files);
        // limiter-user's rooms are held by the order of `lib.rs`'s list
        // (`no_room_imports_one_listed_below_it`), where a room's module
        // listed apart counts as a room of its own.
        if name == "limiter-user" {
            found.retain(|(folder, _)| !folder.is_empty());
        }
        assert!(found.is_empty(), "{name}: modules in a circle (folder, modules): {found:?}");
    }
}
