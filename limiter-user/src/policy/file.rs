//! The policy file (TOML). Unknown fields are refused, and every error
//! names the file, the line and the field. Reading only builds the model;
//! [`Policy::compile`] validates it, and [`Provenance::locate`] puts the file
//! and line on what compile finds. Locating is one pass over the text.
//!
//! ```toml
//! mode = "enforce"        # or "shadow": default mode of every class
//! rate = 1000             # default class: units/s per prefix
//! burst = 2000
//! cost = "packets"        # or "bytes"
//! v4_prefix = 24         # and v6_prefix, capacity: see docs/policy.md
//! missing_kernel_feature = "refuse"  # or "run-without" (docs/operations.md#kernels)
//!
//! [[class]]               # up to 7; the first that matches wins
//! name = "https-syn"
//! protocol = "tcp"        # tcp, udp, icmp, icmpv6, any
//! ports = [443, "8000-8080"]
//! syn = true              # only new TCP connections
//! rate = 20
//! burst = 40
//! mode = "shadow"         # optional, per class
//! syn_cookies = "auto"    # off (default), auto, always: needs syn = true and ports
//! syn_rate = 2000         # auto: engage above this many SYNs/s from new sources
//! tcp_state = "auto"      # off, auto (default where it applies), always
//! ```

mod locate;
mod near;
mod overrides;
mod ports;
mod render;
mod sections;
mod untrusted;
mod window;

use std::path::Path;

use serde::{Deserialize, Serialize};
use toml::Spanned;

use self::{
    locate::{field_at, line_of},
    overrides::{OverrideSpec, build_override},
    ports::PortSpec,
    window::WindowSpec,
};
pub use self::{
    render::render,
    untrusted::{ReadError, read_bytes, read_bytes_with, read_text, read_text_and_metadata},
};

use super::{
    Class, Compiled, CostUnit, Criticality, Limit, Mode, Policy, PolicyError, Protocol, Scope, StoreFailure,
    SynCookies, TcpState, bad, knobs::Knobs,
};

/// Largest policy file read: 131,072 overrides take about 8 MB.
pub const MAX_FILE_BYTES: u64 = 32 << 20;

/// A policy as read, with where it came from.
#[derive(Clone, Debug)]
pub struct Loaded {
    pub policy: Policy,
    pub provenance: Provenance,
}

/// Where a policy came from: errors that [`Policy::compile`] finds later
/// are located in it.
#[derive(Clone, Debug)]
pub enum Provenance {
    BuiltIn,
    /// A file (or text named like one), kept until the policy is applied.
    File {
        name: String,
        text: String,
    },
}

impl Provenance {
    /// The SHA-256 of the file's text, in hex (none for the built-in
    /// policy): what the audit trail names a version of the file by.
    #[must_use]
    pub fn sha256(&self) -> Option<String> {
        use sha2::Digest as _;
        use std::fmt::Write as _;
        let Provenance::File { text, .. } = self else { return None };
        let digest = sha2::Sha256::digest(text.as_bytes());
        Some(digest.iter().fold(String::with_capacity(64), |mut hex, b| {
            let _ = write!(hex, "{b:02x}");
            hex
        }))
    }

    /// The file's name, or `built-in policy`.
    #[must_use]
    pub fn name(&self) -> String {
        match self {
            Provenance::BuiltIn => "built-in policy".into(),
            Provenance::File { name, .. } => name.clone(),
        }
    }
}

impl Loaded {
    /// The built-in policy.
    #[must_use]
    pub fn built_in() -> Self {
        Self { policy: Policy::default(), provenance: Provenance::BuiltIn }
    }

    /// Validate offline (`limiter policy check`): compile, errors located.
    pub fn check(&self) -> Result<Compiled, PolicyError> {
        self.policy.compile(0).map_err(|e| self.provenance.locate(e, &self.policy))
    }
}

/// The file model: what the file says, as it says it ([`build`] makes the
/// policy of it, [`render`] the file of a policy).
#[derive(Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct Root {
    /// A file that sets nothing is refused unless it says this.
    allow_empty: Option<bool>,
    /// A reload may lift most overrides or cut a rate more than 10x.
    allow_shrink: Option<bool>,
    #[serde(default, skip_serializing_if = "super::kernel::MissingFeature::is_default")]
    missing_kernel_feature: super::kernel::MissingFeature,
    /// Out-of-state TCP in the default class.
    #[serde(default, skip_serializing_if = "render::tcp_state_auto")]
    tcp_state: TcpState,
    mode: Option<Spanned<Mode>>,
    /// The top-level settings `limiter run`'s flags share (an error of
    /// one comes without a place: [`placeless`] finds it).
    #[serde(flatten)]
    knobs: Knobs,
    #[serde(default, rename = "class", skip_serializing_if = "Vec::is_empty")]
    classes: Vec<Spanned<ClassSpec>>,
    #[serde(default, rename = "override", skip_serializing_if = "Vec::is_empty")]
    overrides: Vec<Spanned<OverrideSpec>>,
    #[serde(default, rename = "forward", skip_serializing_if = "Vec::is_empty")]
    forwards: Vec<super::forward::Forward>,
    #[serde(default, rename = "tunnel", skip_serializing_if = "Vec::is_empty")]
    tunnels: Vec<crate::tunnel::section::Tunnel>,
    feedback: Option<super::feedback::Feedback>,
    #[serde(default, rename = "feed", skip_serializing_if = "Vec::is_empty")]
    feeds: Vec<super::feed::Feed>,
    #[serde(default, rename = "group", skip_serializing_if = "Vec::is_empty")]
    groups: Vec<crate::groups::section::Group>,
    #[serde(default, rename = "source", skip_serializing_if = "Vec::is_empty")]
    sources: Vec<crate::sources::section::Source>,
    crowdsec: Option<super::crowdsec::Crowdsec>,
    fleet: Option<super::fleet::Fleet>,
    upstream: Option<Box<super::upstream::Upstream>>,
    #[serde(default, skip_serializing_if = "super::attacks::Attacks::is_default")]
    attacks: super::attacks::Attacks,
}

#[derive(Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct ClassSpec {
    name: String,
    #[serde(default)]
    protocol: Protocol,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    ports: Vec<PortSpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    source_ports: Vec<PortSpec>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    syn: bool,
    rate: Option<u64>,
    burst: Option<u64>,
    cost: Option<CostUnit>,
    mode: Option<Mode>,
    limit: Option<u64>,
    #[serde(default, deserialize_with = "super::duration_opt", serialize_with = "super::duration_opt_out")]
    window: Option<std::time::Duration>,
    slices: Option<u32>,
    scope: Option<Scope>,
    on_store_failure: Option<StoreFailure>,
    #[serde(default, skip_serializing_if = "render::cookies_off")]
    syn_cookies: SynCookies,
    syn_rate: Option<u64>,
    tcp_state: Option<TcpState>,
    criticality: Option<Criticality>,
}

/// Read a policy file: a regular file of at most [`MAX_FILE_BYTES`] (a
/// FIFO or a device would block or never end).
pub fn read(path: &Path) -> Result<Loaded, PolicyError> {
    let name = path.display().to_string();
    let fail = |problem: String| PolicyError { field: "(file)".into(), problem, location: Some((name.clone(), 0)) };
    let text = read_text(path, MAX_FILE_BYTES, "a policy").map_err(|e| fail(e.to_string()))?;
    parse(&name, text)
}

/// Parse policy text; `name` is used in error messages. What the text
/// leaves out takes [`Policy::default`].
pub fn parse(name: &str, text: String) -> Result<Loaded, PolicyError> {
    // Offsets are in the rest's coordinates (see `sections`), whose lines
    // are the text's.
    let sections::Split { rest, batches } = sections::split(&text).map_err(|e| PolicyError {
        field: e.field,
        problem: e.problem,
        location: Some((name.to_owned(), line_of(&text, e.offset))),
    })?;
    let locate =
        |e: PolicyError, offset: usize| PolicyError { location: Some((name.to_owned(), line_of(&rest, offset))), ..e };
    let syntax = |e: toml::de::Error, offset: usize| {
        let field = field_at(&text, line_of(&rest, offset));
        locate(bad(field, near::near(e.message().trim())), offset)
    };
    let mut root: Root = toml::from_str(&rest).map_err(|e| match e.span() {
        Some(s) if !s.is_empty() => syntax(e, s.start),
        s => match placeless(&rest, &e) {
            Some((at, message)) => locate(bad(field_at(&text, line_of(&rest, at)), message), at),
            None => syntax(e, s.map_or(0, |s| s.start)),
        },
    })?;
    if let (Some(first), Some(b)) = (root.overrides.first(), batches.first()) {
        let problem = "overrides are given both as [[override]] tables and otherwise (an `override` key or table)";
        return Err(locate(bad("override", problem), first.span().start.min(b.at)));
    }
    for b in batches {
        b.parse_into(&text, &mut root.overrides).map_err(|(e, at)| syntax(e, at))?;
    }
    if root.sets_nothing() && root.allow_empty != Some(true) {
        let problem = "the file sets nothing, which would replace the running policy with the built-in default (a \
                       truncated file?); write `allow_empty = true` if that is meant";
        return Err(locate(bad("(document)", problem), 0));
    }
    let policy = build(root, &rest).map_err(|(e, offset)| locate(e, offset))?;
    Ok(Loaded { policy, provenance: Provenance::File { name: name.to_owned(), text } })
}

impl Root {
    /// Whether nothing but `allow_empty` is set.
    fn sets_nothing(&self) -> bool {
        *self == Root { allow_empty: self.allow_empty, allow_shrink: self.allow_shrink, ..Root::default() }
    }
}

type Located<T> = Result<T, (PolicyError, usize)>;

/// The file's own top-level keys, in order, but the knobs (which go
/// after `mode`): an unknown key's message lists them, as flattening the
/// knobs drops serde's list (the docs' tests hold it to the reference).
const OWN_KEYS: [&str; 17] = [
    "allow_empty",
    "allow_shrink",
    "missing_kernel_feature",
    "tcp_state",
    "mode",
    "class",
    "override",
    "forward",
    "tunnel",
    "feedback",
    "feed",
    "group",
    "source",
    "crowdsec",
    "fleet",
    "upstream",
    "attacks",
];

/// Every top-level key, in the model's order.
fn top_level_keys() -> Vec<String> {
    use clap::Args as _;
    let knobs = Knobs::augment_args(clap::Command::new("knobs"));
    let knobs = knobs.get_arguments().map(|a| a.get_id().to_string());
    let own = |r: std::ops::Range<usize>| OWN_KEYS[r].iter().map(|k| (*k).to_owned());
    own(0..5).chain(knobs).chain(own(5..OWN_KEYS.len())).collect()
}

/// Where an error without a place lies, and what it says: the top-level
/// settings are flattened into the file's model, so their errors (and an
/// unknown top-level key's) come without one. An unknown key names
/// itself; a value of the wrong type is found by trying each top-level
/// key alone.
fn placeless(text: &str, e: &toml::de::Error) -> Option<(usize, String)> {
    let message = e.message().trim();
    if let Some(key) = message.strip_prefix("unknown field `").and_then(|r| r.split_once('`')).map(|(k, _)| k) {
        let keys: Vec<String> = top_level_keys().iter().map(|k| format!("`{k}`")).collect();
        return Some((
            locate::offset_of(text, key),
            near::near(&format!("unknown field `{key}`, expected one of {}", keys.join(", "))),
        ));
    }
    let table: toml::Table = text.parse().ok()?;
    let bad = table.into_iter().find(|(k, v)| {
        let alone: toml::Table = [(k.clone(), v.clone())].into_iter().collect();
        alone.try_into::<Knobs>().is_err()
    })?;
    Some((locate::offset_of(text, &bad.0), message.to_owned()))
}

fn build(root: Root, text: &str) -> Located<Policy> {
    let Root {
        allow_empty: _,
        allow_shrink,
        mode,
        knobs,
        classes,
        overrides,
        mut forwards,
        tunnels,
        feedback,
        feeds,
        groups,
        sources,
        crowdsec,
        fleet,
        upstream,
        attacks,
        missing_kernel_feature,
        tcp_state,
    } = root;
    super::forward::name_defaults(&mut forwards);
    let base = knobs.apply(Policy::default()).map_err(|(e, given)| (e, locate::offset_of(text, given)))?;
    let global_mode = mode.map_or(base.default.mode, Spanned::into_inner);
    let default = Limit { mode: global_mode, ..base.default };
    let classes =
        classes.into_iter().enumerate().map(|(i, c)| build_class(i, c, global_mode)).collect::<Located<Vec<_>>>()?;
    let overrides =
        overrides.into_iter().enumerate().map(|(i, o)| build_override(i, o, default)).collect::<Located<Vec<_>>>()?;
    Ok(Policy {
        default,
        classes,
        overrides,
        forwards,
        tunnels,
        feedback,
        feeds,
        groups,
        sources,
        crowdsec,
        fleet,
        upstream,
        attacks,
        allow_shrink: allow_shrink.unwrap_or(false),
        missing_kernel_feature,
        tcp_state,
        ..base
    })
}

fn build_class(i: usize, c: Spanned<ClassSpec>, global_mode: Mode) -> Located<Class> {
    let start = c.span().start;
    let ClassSpec {
        name,
        protocol,
        ports,
        source_ports,
        syn,
        rate,
        burst,
        cost,
        mode,
        limit,
        window,
        slices,
        scope,
        on_store_failure,
        syn_cookies,
        syn_rate,
        tcp_state,
        criticality,
    } = c.into_inner();
    let at = format!("class[{i}].");
    let window = WindowSpec { limit, window, slices, scope, on_store_failure }
        .build(&at, (rate, burst))
        .map_err(|e| (e, start))?;
    let (rate, burst) = match (window, rate, burst) {
        (Some(_), ..) => (0, 0),
        (None, Some(r), Some(b)) => (r, b),
        (None, r, _) => {
            let field = if r.is_none() { "rate" } else { "burst" };
            return Err((bad(format!("{at}{field}"), "give rate and burst (a bucket) or limit and window"), start));
        }
    };
    Ok(Class {
        name,
        protocol,
        ports: ports.into_iter().map(|PortSpec(lo, hi)| (lo, hi)).collect(),
        source_ports: source_ports.into_iter().map(|PortSpec(lo, hi)| (lo, hi)).collect(),
        syn,
        limit: Limit {
            rate,
            burst,
            cost: cost.unwrap_or(CostUnit::Packets),
            mode: mode.unwrap_or(global_mode),
            window,
        },
        syn_cookies,
        syn_rate,
        tcp_state,
        criticality: criticality.unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests;
