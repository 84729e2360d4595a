//! Where in the text a field stands: one pass over the lines, keeping the
//! dotted path of the table each line is in, so locating an error is
//! linear in the size of the file.

use super::Provenance;
use crate::policy::{Policy, PolicyError};

impl Provenance {
    /// Put file and line on an error of `applied`, which is this origin's
    /// policy, possibly with runtime overrides merged in: an error of
    /// override `k` is located by that override's network, so it points at
    /// the right table (or says it was set at run time).
    #[must_use]
    pub fn locate(&self, e: PolicyError, applied: &Policy) -> PolicyError {
        let Provenance::File { name, text } = self else { return e };
        if e.location.is_some() {
            return e;
        }
        let at = |line: usize, field: String| PolicyError {
            field,
            location: Some((name.clone(), line)),
            problem: e.problem.clone(),
        };
        if let Some((k, rest)) = override_field(&e.field) {
            let Some(net) = applied.overrides.get(k).map(|o| o.net) else { return e };
            return match override_line(text, net) {
                Some((j, _)) => {
                    let field = format!("override[{j}]{rest}");
                    at(find_field(text, &field), field)
                }
                None => PolicyError { problem: format!("{} ({net} was set at run time)", e.problem), ..e },
            };
        }
        at(find_field(text, &e.field), e.field.clone())
    }
}

/// 1-based line of a byte offset.
pub(super) fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// Each line of `text` with the dotted path of the key on it (e.g.
/// `class[1].rate`; a table header line gives the table's path), in one
/// pass.
fn paths(text: &str) -> impl Iterator<Item = (usize, String, &str)> {
    let mut table = String::new();
    let mut counts: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    text.lines().enumerate().map(move |(n, line)| {
        let t = line.trim();
        if let Some(name) = t.strip_prefix("[[").and_then(|r| r.split_once("]]")).map(|(n, _)| n.trim().to_owned()) {
            let i = counts.entry(name.clone()).or_insert(0);
            table = format!("{name}[{i}]");
            *i += 1;
            return (n + 1, table.clone(), "");
        }
        if let Some(name) = t.strip_prefix('[').and_then(|r| r.split_once(']')).map(|(n, _)| n.trim().to_owned()) {
            table = name;
            return (n + 1, table.clone(), "");
        }
        let (key, value) = t.split_once('=').map_or((t, ""), |(k, v)| (k.trim(), v.trim()));
        let path = if table.is_empty() { key.to_owned() } else { format!("{table}.{key}") };
        (n + 1, path, value)
    })
}

/// Byte offset of the line where `field` is first mentioned (or the
/// table holding it; 0 when neither is).
pub(super) fn offset_of(text: &str, field: &str) -> usize {
    let line = find_field(text, field);
    text.split_inclusive('\n').take(line - 1).map(str::len).sum()
}

/// Field path of the key on 1-based line `line_no`.
pub(super) fn field_at(text: &str, line_no: usize) -> String {
    paths(text).find(|(n, ..)| *n == line_no).map_or_else(|| "(document)".into(), |(_, p, _)| p)
}

/// Line of the first mention of `field`, or of the table holding it.
fn find_field(text: &str, field: &str) -> usize {
    let mut fallback = None;
    for (n, path, _) in paths(text) {
        if path == field {
            return n;
        }
        if fallback.is_none() && !path.is_empty() && field.starts_with(&path) {
            fallback = Some(n);
        }
    }
    fallback.unwrap_or(1)
}

/// `override[K]` and the rest of the path, if `field` names an override.
fn override_field(field: &str) -> Option<(usize, &str)> {
    let (k, rest) = field.strip_prefix("override[")?.split_once(']')?;
    Some((k.parse().ok()?, rest))
}

/// Index among the file's `[[override]]` tables and line of the last one
/// whose cidr is `net` (the last: a duplicate is reported where it repeats).
fn override_line(text: &str, net: ipnet::IpNet) -> Option<(usize, usize)> {
    let mut found = None;
    for (n, path, value) in paths(text) {
        if let Some((j, ".cidr")) = override_field(&path)
            && value.trim_matches('"').parse::<ipnet::IpNet>().ok() == Some(net)
        {
            found = Some((j, n));
        }
    }
    found
}
