//! The policy file (TOML). Unknown fields are refused, and every error
//! names the file, the line and the field.
//!
//! ```toml
//! mode = "enforce"        # or "shadow": default mode of every class
//! rate = 1000             # default class: units/s per prefix
//! burst = 2000
//! cost = "packets"        # or "bytes"
//! v4_prefix = 24
//! v6_prefix = 56
//! capacity = 262144
//!
//! [[class]]               # up to 7; the first that matches wins
//! name = "https-syn"
//! protocol = "tcp"        # tcp, udp, icmp, icmpv6, any
//! ports = [443, "8000-8080"]
//! syn = true              # only new TCP connections
//! rate = 20
//! burst = 40
//! mode = "shadow"         # optional, per class
//! ```

use std::path::Path;

use serde::Deserialize;
use toml::Spanned;

use super::{Class, CostUnit, Limit, Mode, Override, OverrideAction, Policy, PolicyError, bad};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Root {
    mode: Option<Spanned<String>>,
    rate: Option<Spanned<u64>>,
    burst: Option<Spanned<u64>>,
    cost: Option<Spanned<String>>,
    v4_prefix: Option<Spanned<u32>>,
    v6_prefix: Option<Spanned<u32>>,
    capacity: Option<Spanned<u32>>,
    new_source_rate: Option<Spanned<u64>>,
    new_source_burst: Option<Spanned<u64>>,
    aggregate_rate: Option<Spanned<u64>>,
    aggregate_burst: Option<Spanned<u64>>,
    aggregate_v4_prefix: Option<Spanned<u32>>,
    aggregate_v6_prefix: Option<Spanned<u32>>,
    #[serde(default, rename = "class")]
    classes: Vec<Spanned<ClassSpec>>,
    #[serde(default, rename = "override")]
    overrides: Vec<Spanned<OverrideSpec>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OverrideSpec {
    cidr: Spanned<String>,
    action: Option<Spanned<String>>,
    rate: Option<Spanned<u64>>,
    burst: Option<Spanned<u64>>,
    mode: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClassSpec {
    name: Spanned<String>,
    protocol: Option<Spanned<String>>,
    ports: Option<Spanned<Vec<PortSpec>>>,
    syn: Option<Spanned<bool>>,
    rate: Spanned<u64>,
    burst: Spanned<u64>,
    cost: Option<Spanned<String>>,
    mode: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum PortSpec {
    Port(u16),
    Range(String),
}

/// Read and validate a policy file. `base` supplies what the file leaves
/// out (normally [`Policy::default`]).
pub fn load(path: &Path, base: &Policy) -> Result<Policy, PolicyError> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| PolicyError {
        field: "(file)".into(),
        problem: e.to_string(),
        location: Some((name.clone(), 0)),
    })?;
    parse(&name, &text, base)
}

/// Parse and validate policy text; `name` is used in error messages.
pub fn parse(name: &str, text: &str, base: &Policy) -> Result<Policy, PolicyError> {
    let locate =
        |e: PolicyError, offset: usize| PolicyError { location: Some((name.to_owned(), line_of(text, offset))), ..e };
    let root: Root = toml::from_str(text).map_err(|e| {
        let offset = e.span().map_or(0, |s| s.start);
        let field = field_at(text, offset);
        locate(bad(field, e.message().trim().to_owned()), offset)
    })?;
    let policy = build(root, base).map_err(|(e, offset)| locate(e, offset))?;
    // Whole-policy checks name the field; point at its first mention.
    policy.compile(0).map_err(|e| {
        let offset = find_field(text, &e.field);
        locate(e, offset)
    })?;
    Ok(policy)
}

type Located<T> = Result<T, (PolicyError, usize)>;

fn build(root: Root, base: &Policy) -> Located<Policy> {
    let Root {
        mode,
        rate,
        burst,
        cost,
        v4_prefix,
        v6_prefix,
        capacity,
        new_source_rate,
        new_source_burst,
        aggregate_rate,
        aggregate_burst,
        aggregate_v4_prefix,
        aggregate_v6_prefix,
        classes,
        overrides,
    } = root;
    let global_mode = opt(mode, "mode", parse_mode)?.unwrap_or(base.default.mode);
    let default = Limit {
        rate: rate.map_or(base.default.rate, Spanned::into_inner),
        burst: burst.map_or(base.default.burst, Spanned::into_inner),
        cost: opt(cost, "cost", parse_cost)?.unwrap_or(base.default.cost),
        mode: global_mode,
    };
    let classes = classes
        .into_iter()
        .enumerate()
        .map(|(i, c)| build_class(i, c.into_inner(), global_mode))
        .collect::<Located<Vec<_>>>()?;
    let overrides = overrides
        .into_iter()
        .enumerate()
        .map(|(i, o)| {
            let start = o.span().start;
            build_override(i, o.into_inner(), default, start)
        })
        .collect::<Located<Vec<_>>>()?;
    let new_sources = match (new_source_rate, new_source_burst) {
        (None, None) => base.new_sources,
        // 0 turns the budget off (the burst, if given, is moot).
        (Some(r), _) if *r.get_ref() == 0 => None,
        (Some(r), Some(b)) => Some((r.into_inner(), b.into_inner())),
        (Some(r), None) => {
            return Err((bad("new_source_burst", "new_source_rate needs new_source_burst"), r.span().start));
        }
        (None, Some(b)) => {
            return Err((bad("new_source_rate", "new_source_burst needs new_source_rate"), b.span().start));
        }
    };
    let aggregate = match (aggregate_rate, aggregate_burst) {
        (None, None) => {
            if let Some(p) =
                aggregate_v4_prefix.as_ref().map(Spanned::span).or(aggregate_v6_prefix.as_ref().map(Spanned::span))
            {
                return Err((
                    bad("aggregate_rate", "aggregate prefixes need aggregate_rate and aggregate_burst"),
                    p.start,
                ));
            }
            base.aggregate
        }
        (Some(r), Some(b)) => Some(super::Aggregate {
            rate: r.into_inner(),
            burst: b.into_inner(),
            v4_prefix: aggregate_v4_prefix.map_or(16, Spanned::into_inner),
            v6_prefix: aggregate_v6_prefix.map_or(40, Spanned::into_inner),
        }),
        (Some(r), None) => {
            return Err((bad("aggregate_burst", "aggregate_rate needs aggregate_burst"), r.span().start));
        }
        (None, Some(b)) => return Err((bad("aggregate_rate", "aggregate_burst needs aggregate_rate"), b.span().start)),
    };
    Ok(Policy {
        default,
        classes,
        overrides,
        new_sources,
        aggregate,
        v4_prefix: v4_prefix.map_or(base.v4_prefix, Spanned::into_inner),
        v6_prefix: v6_prefix.map_or(base.v6_prefix, Spanned::into_inner),
        capacity: capacity.map_or(base.capacity, Spanned::into_inner),
    })
}

fn build_class(i: usize, c: ClassSpec, global_mode: Mode) -> Located<Class> {
    let at = |f: &str| format!("class[{i}].{f}");
    let ClassSpec { name, protocol, ports, syn, rate, burst, cost, mode } = c;
    let protocol = opt(protocol, &at("protocol"), parse_protocol)?.unwrap_or(0);
    let ports = match ports {
        None => Vec::new(),
        Some(p) => {
            let start = p.span().start;
            p.into_inner()
                .into_iter()
                .map(|s| parse_port(&s).map_err(|e| (bad(at("ports"), e), start)))
                .collect::<Located<_>>()?
        }
    };
    Ok(Class {
        name: name.into_inner(),
        protocol,
        ports,
        syn: syn.is_some_and(Spanned::into_inner),
        limit: Limit {
            rate: rate.into_inner(),
            burst: burst.into_inner(),
            cost: opt(cost, &at("cost"), parse_cost)?.unwrap_or(CostUnit::Packets),
            mode: opt(mode, &at("mode"), parse_mode)?.unwrap_or(global_mode),
        },
    })
}

fn build_override(i: usize, o: OverrideSpec, default: Limit, start: usize) -> Located<Override> {
    let at = |f: &str| format!("override[{i}].{f}");
    let OverrideSpec { cidr, action, rate, burst, mode } = o;
    let cidr_at = cidr.span().start;
    let net = cidr
        .get_ref()
        .parse::<ipnet::IpNet>()
        .map_err(|e| (bad(at("cidr"), format!("{:?}: {e}", cidr.get_ref())), cidr_at))?;
    let action = match (action, rate, burst) {
        (Some(a), None, None) => {
            let a_at = a.span().start;
            match a.get_ref().as_str() {
                "allow" => OverrideAction::Allow,
                "deny" => OverrideAction::Deny,
                other => {
                    return Err((bad(at("action"), format!("{other:?} is not \"allow\" or \"deny\"")), a_at));
                }
            }
        }
        (None, Some(r), Some(b)) => OverrideAction::Limit(Limit {
            rate: r.into_inner(),
            burst: b.into_inner(),
            cost: default.cost,
            mode: opt(mode, &at("mode"), parse_mode)?.unwrap_or(default.mode),
        }),
        _ => {
            return Err((bad(at("action"), "give either action = \"allow\"/\"deny\" or both rate and burst"), start));
        }
    };
    Ok(Override { net, action })
}

/// The policy as a policy file that [`parse`] reads back to the same policy.
#[must_use]
pub fn render(p: &Policy) -> String {
    use std::fmt::Write as _;
    let proto = |n: u8| match n {
        0 => "any",
        1 => "icmp",
        6 => "tcp",
        17 => "udp",
        _ => "icmpv6",
    };
    let d = p.default;
    let mut s = format!(
        "mode = \"{}\"\nrate = {}\nburst = {}\ncost = \"{}\"\nv4_prefix = {}\nv6_prefix = {}\ncapacity = {}\n",
        d.mode.label(),
        d.rate,
        d.burst,
        d.cost.label(),
        p.v4_prefix,
        p.v6_prefix,
        p.capacity
    );
    match p.new_sources {
        Some((rate, burst)) => {
            let _ = writeln!(s, "new_source_rate = {rate}\nnew_source_burst = {burst}");
        }
        None => s.push_str("new_source_rate = 0\n"),
    }
    if let Some(a) = p.aggregate {
        let _ = writeln!(
            s,
            "aggregate_rate = {}\naggregate_burst = {}\naggregate_v4_prefix = {}\naggregate_v6_prefix = {}",
            a.rate, a.burst, a.v4_prefix, a.v6_prefix
        );
    }
    for c in &p.classes {
        let l = c.limit;
        let _ = write!(s, "\n[[class]]\nname = {:?}\nprotocol = \"{}\"\n", c.name, proto(c.protocol));
        if !c.ports.is_empty() {
            let ports: Vec<String> = c
                .ports
                .iter()
                .map(|&(lo, hi)| if lo == hi { lo.to_string() } else { format!("\"{lo}-{hi}\"") })
                .collect();
            let _ = writeln!(s, "ports = [{}]", ports.join(", "));
        }
        if c.syn {
            s.push_str("syn = true\n");
        }
        let _ = writeln!(
            s,
            "rate = {}\nburst = {}\ncost = \"{}\"\nmode = \"{}\"",
            l.rate,
            l.burst,
            l.cost.label(),
            l.mode.label()
        );
    }
    for o in &p.overrides {
        let _ = write!(s, "\n[[override]]\ncidr = \"{}\"\n", o.net);
        match o.action {
            OverrideAction::Allow => s.push_str("action = \"allow\"\n"),
            OverrideAction::Deny => s.push_str("action = \"deny\"\n"),
            OverrideAction::Limit(l) => {
                let _ = writeln!(s, "rate = {}\nburst = {}\nmode = \"{}\"", l.rate, l.burst, l.mode.label());
            }
        }
    }
    s
}

/// Convert an optional string field, locating a bad value.
fn opt<T>(v: Option<Spanned<String>>, field: &str, f: fn(&str) -> Result<T, String>) -> Located<Option<T>> {
    v.map(|s| {
        let start = s.span().start;
        f(s.get_ref()).map_err(|e| (bad(field, e), start))
    })
    .transpose()
}

fn parse_mode(s: &str) -> Result<Mode, String> {
    match s {
        "enforce" => Ok(Mode::Enforce),
        "shadow" => Ok(Mode::Shadow),
        _ => Err(format!("{s:?} is not \"enforce\" or \"shadow\"")),
    }
}

fn parse_cost(s: &str) -> Result<CostUnit, String> {
    match s {
        "packets" => Ok(CostUnit::Packets),
        "bytes" => Ok(CostUnit::Bytes),
        _ => Err(format!("{s:?} is not \"packets\" or \"bytes\"")),
    }
}

fn parse_protocol(s: &str) -> Result<u8, String> {
    match s {
        "any" => Ok(0),
        "icmp" => Ok(1),
        "tcp" => Ok(6),
        "udp" => Ok(17),
        "icmpv6" => Ok(58),
        _ => Err(format!("{s:?} is not one of tcp, udp, icmp, icmpv6, any")),
    }
}

fn parse_port(p: &PortSpec) -> Result<(u16, u16), String> {
    let (lo, hi) = match p {
        PortSpec::Port(n) => (*n, *n),
        PortSpec::Range(r) => {
            let (a, b) = r.split_once('-').ok_or_else(|| format!("{r:?} is not a port or a \"low-high\" range"))?;
            let num = |x: &str| x.trim().parse::<u16>().map_err(|_| format!("{r:?}: {x:?} is not a port number"));
            (num(a)?, num(b)?)
        }
    };
    if lo == 0 || lo > hi {
        return Err(format!("{lo}-{hi} is not a range of ports 1..=65535"));
    }
    Ok((lo, hi))
}

/// 1-based line of a byte offset.
fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// Field path (e.g. `class[1].rate`) of the key on the line holding `offset`.
fn field_at(text: &str, offset: usize) -> String {
    let line_no = line_of(text, offset);
    let mut table = String::new();
    let mut counts: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (n, line) in text.lines().enumerate() {
        let t = line.trim();
        if n + 1 == line_no {
            let key = t.split_once('=').map_or(t, |(k, _)| k).trim();
            return if table.is_empty() { key.to_owned() } else { format!("{table}.{key}") };
        }
        if let Some(name) = t.strip_prefix("[[").and_then(|r| r.split_once("]]")).map(|(n, _)| n.trim().to_owned()) {
            let i = counts.entry(name.clone()).or_insert(0);
            table = format!("{name}[{i}]");
            *i += 1;
        } else if let Some(name) = t.strip_prefix('[').and_then(|r| r.split_once(']')).map(|(n, _)| n.trim().to_owned())
        {
            table = name;
        }
    }
    "(document)".into()
}

/// Offset of the first line whose field path is `field` (or its table).
fn find_field(text: &str, field: &str) -> usize {
    let mut offset = 0;
    let mut fallback = None;
    for line in text.split_inclusive('\n') {
        let path = field_at(text, offset);
        if path == field {
            return offset;
        }
        if fallback.is_none() && field.starts_with(&path) && !path.is_empty() {
            fallback = Some(offset);
        }
        offset += line.len();
    }
    fallback.unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
mode = "enforce"
rate = 500
burst = 1000
v6_prefix = 48

[[class]]
name = "https-syn"
protocol = "tcp"
ports = [443, "8000-8080"]
syn = true
rate = 20
burst = 40
mode = "shadow"

[[class]]
name = "quic"
protocol = "udp"
ports = [443]
rate = 2000
burst = 4000
"#;

    fn err(text: &str) -> PolicyError {
        parse("p.toml", text, &Policy::default()).unwrap_err()
    }

    #[test]
    fn a_full_policy_parses() {
        let p = parse("p.toml", GOOD, &Policy::default()).unwrap();
        assert_eq!((p.default.rate, p.default.burst, p.v6_prefix, p.v4_prefix), (500, 1000, 48, 24));
        assert_eq!(p.classes.len(), 2);
        assert_eq!(p.classes[0].ports, vec![(443, 443), (8000, 8080)]);
        assert_eq!((p.classes[0].syn, p.classes[0].limit.mode), (true, Mode::Shadow));
        assert_eq!((p.classes[1].protocol, p.classes[1].limit.mode), (17, Mode::Enforce));
    }

    #[test]
    fn errors_name_file_line_and_field() {
        let cases = [
            ("rate = 10\nbursty = 3\n", 2, "bursty", "unknown field"),
            ("rate = \"fast\"\n", 1, "rate", "invalid type"),
            ("rate = -5\n", 1, "rate", ""),
            ("mode = \"loud\"\n", 1, "mode", "enforce"),
            ("rate = 0\n", 1, "rate", "outside"),
            ("v4_prefix = 40\n", 1, "v4_prefix", "longer than 32"),
            (
                "[[class]]\nname = \"a\"\nrate = 1\nburst = 1\nprotocol = \"sctp\"\n",
                5,
                "class[0].protocol",
                "not one of",
            ),
            ("[[class]]\nname = \"a\"\nrate = 1\nburst = 1\nsyn = true\n", 5, "class[0].syn", "tcp"),
            (
                "[[class]]\nname = \"a\"\nrate = 1\nburst = 1\n[[class]]\nname = \"b\"\nrate = 0\nburst = 1\n",
                7,
                "class[1].rate",
                "outside",
            ),
            (
                "[[class]]\nname = \"a\"\nprotocol = \"udp\"\nports = [\"9-3\"]\nrate = 1\nburst = 1\n",
                4,
                "class[0].ports",
                "range",
            ),
            ("[[class]]\nname = \"a\"\nrate = 1\nburst = 1\ncolour = 1\n", 5, "class[0].colour", "unknown field"),
            ("[[override]]\ncidr = \"198.18.5.7/24\"\naction = \"allow\"\n", 2, "override[0].cidr", "host bits"),
            (
                "[[override]]\ncidr = \"198.18.5.0/24\"\naction = \"allow\"\n[[override]]\ncidr = \"nonsense\"\naction = \"deny\"\n",
                5,
                "override[1].cidr",
                "invalid",
            ),
            ("[[override]]\ncidr = \"198.18.5.0/24\"\naction = \"maybe\"\n", 3, "override[0].action", "allow"),
            ("[[override]]\ncidr = \"198.18.5.0/24\"\nrate = 5\n", 1, "override[0].action", "both rate and burst"),
            ("[[override]]\ncidr = \"198.18.5.0/25\"\naction = \"deny\"\n", 2, "override[0].cidr", "bucket prefix"),
            ("new_source_rate = 5\n", 1, "new_source_burst", "needs"),
            ("aggregate_v4_prefix = 12\n", 1, "aggregate_rate", "need"),
            (
                "v4_prefix = 16\naggregate_rate = 1\naggregate_burst = 1\naggregate_v4_prefix = 20\n",
                4,
                "aggregate_v4_prefix",
                "finer",
            ),
        ];
        for (text, line, field, problem) in cases {
            let e = err(text);
            assert_eq!(e.location, Some(("p.toml".into(), line)), "{text:?}: {e}");
            assert_eq!(e.field, field, "{text:?}: {e}");
            assert!(e.problem.contains(problem), "{text:?}: {e}");
            assert!(e.to_string().starts_with(&format!("p.toml:{line}: {field}: ")), "{e}");
        }
    }

    #[test]
    fn the_new_source_budget_is_on_by_default_and_zero_turns_it_off() {
        let d = parse("t.toml", "", &Policy::default()).unwrap();
        assert_eq!(d.new_sources, Some(super::super::DEFAULT_NEW_SOURCES));
        let off = parse("t.toml", "new_source_rate = 0\n", &Policy::default()).unwrap();
        assert_eq!(off.new_sources, None);
        // Rendered, an unlimited budget reads back as unlimited.
        assert_eq!(parse("t.toml", &render(&off), &Policy::default()).unwrap().new_sources, None);
    }

    #[test]
    fn render_reads_back_to_the_same_policy() {
        let mut text = GOOD.to_owned();
        text = format!(
            "new_source_rate = 500\nnew_source_burst = 900\naggregate_rate = 4000\naggregate_burst = 8000\n{text}"
        );
        text.push_str("\n[[override]]\ncidr = \"198.18.0.0/16\"\nrate = 5\nburst = 9\n\n[[override]]\ncidr = \"2001:2::/48\"\naction = \"deny\"\n");
        let p = parse("p.toml", &text, &Policy::default()).unwrap();
        assert_eq!(p.overrides.len(), 2);
        assert_eq!(p.new_sources, Some((500, 900)));
        assert_eq!(p.aggregate.map(|a| (a.rate, a.v4_prefix, a.v6_prefix)), Some((4000, 16, 40)));
        let again = parse("rendered", &render(&p), &Policy::default()).unwrap();
        assert_eq!(again, p);
    }

    #[test]
    fn missing_file_is_an_error_with_its_path() {
        let e = load(Path::new("/nonexistent/limiter.toml"), &Policy::default()).unwrap_err();
        assert!(e.to_string().starts_with("/nonexistent/limiter.toml:"), "{e}");
    }
}
