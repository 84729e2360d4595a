//! The upstream feature: while the policy has an `[upstream]` section, a
//! [`Book`] of the rules wanted (the operator's over the control socket,
//! escalation's proven sources, link pressure's top droppers) and the
//! [`Speaker`] thread that keeps the BGP speaker's routes equal to it.
//! The loop only edits the book and hands the thread a copy; it never
//! waits on the speaker.

use std::time::Duration;

use ipnet::IpNet;

use super::{
    Action, Book, Key, Refusal, Rule, UpstreamInfo,
    series::UpstreamReport,
    speaker::{Saved, Sending, Speaker},
};
use crate::engine::{
    changes::Change,
    feature::{Applied, Drain, Feature, InForce, Note, Second},
};
use crate::{
    control::{ErrorCode, PrefixShow, Request, Response, StatusInfo},
    dataplane::Totals,
    origin::Origin,
    policy::{CostUnit, OverrideAction, upstream::Upstream},
    series::Series,
};

/// How long a stop waits for the speaker's withdrawals.
const STOP_WAIT: Duration = Duration::from_secs(5);

/// The feature (nothing while the policy has no `[upstream]`).
#[derive(Debug)]
pub(crate) struct UpstreamSide {
    iface: String,
    on: Option<On>,
    /// Bytes the interface and the program had received at the last
    /// second.
    last_rx: Option<(u64, u64)>,
    /// What a pressure rule of each class matches (its protocol and
    /// ports), by class index (0: the default class, which matches
    /// anything).
    class_match: Vec<Match>,
    /// A prefix's whole allowance in bytes a second (every class's rate
    /// together): a pressure rule is never tighter.
    allowance: u64,
    /// The rules wanted at the last push, and what automation (and
    /// expiry) changed of them since the loop last asked.
    told: std::collections::BTreeMap<super::rule::Key, Rule>,
    notes: Vec<Note>,
    /// The push to come follows expiry (rules it removes were not
    /// withdrawn by anyone's request).
    expiring: bool,
}

/// What a class's traffic is, as a FlowSpec rule can say it.
#[derive(Clone, Debug, Default)]
struct Match {
    protocol: Option<u8>,
    source_ports: Vec<(u16, u16)>,
    ports: Vec<(u16, u16)>,
}

impl Match {
    fn of(c: &crate::policy::Class) -> Self {
        use crate::policy::Protocol;
        let protocol = match c.protocol {
            Protocol::Any => None,
            Protocol::Icmp => Some(1),
            Protocol::Tcp => Some(6),
            Protocol::Udp => Some(17),
            Protocol::Icmpv6 => Some(58),
        };
        Self { protocol, source_ports: c.source_ports.clone(), ports: c.ports.clone() }
    }
}

/// The interface's own addresses (global ones, not link-local).
#[expect(clippy::cast_ptr_alignment, reason = "getifaddrs gives each address aligned as its family's sockaddr")]
fn own_addresses(iface: &str) -> Vec<std::net::IpAddr> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list freed below.
    if unsafe { libc::getifaddrs(&raw mut head) } != 0 {
        return out;
    }
    let mut at = head;
    while !at.is_null() {
        // SAFETY: a node of the list getifaddrs returned.
        let ifa = unsafe { &*at };
        at = ifa.ifa_next;
        // SAFETY: a NUL-terminated name.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
        if ifa.ifa_addr.is_null() || name.to_bytes() != iface.as_bytes() {
            continue;
        }
        // SAFETY: the address's family says which sockaddr it is.
        let addr = unsafe {
            match i32::from((*ifa.ifa_addr).sa_family) {
                libc::AF_INET => {
                    let a = &*ifa.ifa_addr.cast::<libc::sockaddr_in>();
                    Some(std::net::IpAddr::from(u32::from_be(a.sin_addr.s_addr).to_be_bytes()))
                }
                libc::AF_INET6 => {
                    let a = &*ifa.ifa_addr.cast::<libc::sockaddr_in6>();
                    Some(std::net::IpAddr::from(a.sin6_addr.s6_addr))
                }
                _ => None,
            }
        };
        if let Some(a) = addr.filter(|a| !matches!(a, std::net::IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80))
        {
            out.push(a);
        }
    }
    // SAFETY: the list getifaddrs returned, freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// The destination of a pressure rule from `net`: this host's address of
/// its family, when the interface has exactly one (else none: any).
fn own_destination(own: &[std::net::IpAddr], net: &IpNet) -> Option<IpNet> {
    let mut same = own.iter().filter(|a| a.is_ipv4() == net.addr().is_ipv4());
    match (same.next(), same.next()) {
        (Some(a), None) => Some(IpNet::from(*a)),
        _ => None,
    }
}

#[derive(Debug)]
struct On {
    book: Book,
    speaker: Option<Speaker>,
}

fn sending(s: &Upstream) -> Sending {
    Sending { shadow: s.shadow, communities: s.communities.clone(), max_changes_per_minute: s.max_changes_per_minute }
}

/// Stop a speaker thread off the loop (withdrawing its rules when `withdraw`).
fn stop_aside(speaker: Speaker, withdraw: bool) {
    let _ = std::thread::Builder::new()
        .name("limiter-upstream-stop".into())
        .spawn(move || speaker.stop(withdraw, STOP_WAIT));
}

impl UpstreamSide {
    pub(crate) fn new(iface: &str) -> Self {
        Self {
            iface: iface.to_owned(),
            on: None,
            last_rx: None,
            class_match: Vec::new(),
            allowance: 0,
            told: std::collections::BTreeMap::new(),
            notes: Vec::new(),
            expiring: false,
        }
    }

    /// Start on `spec`: the rules the state file wants and whose time is
    /// not up, under today's section; the speaker is told what the file
    /// says it holds (what is no longer wanted is withdrawn).
    fn start(spec: &Upstream, allowed: Vec<IpNet>) -> On {
        let saved = Saved::read(&spec.state).unwrap_or_else(|e| {
            tracing::error!(event = "upstream", "limiter: upstream state unreadable ({e}): starting with no rules; what an earlier run announced is not known");
            Saved::default()
        });
        let mut book = Book::new(spec.clone(), allowed);
        let now = crate::clock::unix_now();
        for r in saved.wanted.into_iter().filter(|r| r.expires > now) {
            let what = r.describe();
            if let Err(e) = book.add(r) {
                tracing::warn!(event = "upstream", "limiter: upstream {what} from the state file not kept: {e}");
            }
        }
        let kept = book.rules().count();
        tracing::info!(
            event = "upstream",
            "limiter: upstream speaker {}: {kept} rule(s) wanted, {} announced by the last run",
            spec.speaker.display(),
            saved.announced.len()
        );
        let given = Saved { wanted: Vec::new(), announced: saved.announced, communities: saved.communities };
        let speaker =
            Speaker::start(&spec.speaker, spec.state.clone(), given, book.rules().cloned().collect(), sending(spec));
        On { book, speaker: Some(speaker) }
    }

    fn push(&mut self) {
        let Some(on) = &self.on else { return };
        let now: std::collections::BTreeMap<_, _> = on.book.rules().map(|r| (r.key.clone(), r.clone())).collect();
        // Automation's rules announced and withdrawn, and what expiry
        // took (the operator's own requests are heard as answers).
        for (k, r) in &now {
            if r.by != Origin::Operator && self.told.get(k).is_none_or(|o| o.by != r.by || o.action != r.action) {
                self.notes.push(Note { by: r.by.label().into(), what: format!("upstream announce {}", r.describe()) });
            }
        }
        for (k, r) in &self.told {
            if !now.contains_key(k) && (r.by != Origin::Operator || self.expiring) {
                // The operator's rule ends by expiry; automation's are its
                // own to end (a pressure rule's time is its hold-down).
                let by = if r.by == Origin::Operator { "expiry" } else { r.by.label() };
                let why = if self.expiring { "its time is up" } else { "no longer wanted" };
                self.notes.push(Note { by: by.into(), what: format!("upstream withdraw {} ({why})", r.describe()) });
            }
        }
        self.notes.truncate(1_000);
        self.told = now;
        self.expiring = false;
        if let Some(s) = &on.speaker {
            s.want(on.book.rules().cloned().collect(), sending(on.book.spec()));
        }
    }

    /// Tell the book what the speaker holds and has pending, which a
    /// refusal at the cap states.
    fn sent(on: &mut On) {
        let status = on.speaker.as_ref().map(Speaker::status).unwrap_or_default();
        on.book.sent = (status.announced, status.pending);
    }

    /// With link pressure on: how many of the top dropping prefixes it
    /// takes each second.
    fn pressure_prefixes(&self) -> Option<usize> {
        self.on.as_ref().map(|on| on.book.spec()).filter(|s| s.link_capacity > 0).map(|s| s.pressure_prefixes)
    }

    /// Once a second, with link pressure on: the bits received (the
    /// interface's count, or what the program saw if that is more) and
    /// the prefixes the program drops most (with their class index). A
    /// rule matches what the host itself drops of the prefix (the class's
    /// protocol and ports, to this host's address) and is rate-limited to
    /// the prefix's whole allowance: a spoofer who floods from a victim's
    /// prefix gets the transit to hold no more of the victim's traffic
    /// than this host would.
    fn second(&mut self, totals: &Totals, dropping: &[(IpNet, u8)]) {
        let Some(on) = &mut self.on else { return };
        let sysfs = std::fs::read_to_string(format!("/sys/class/net/{}/statistics/rx_bytes", self.iface))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0);
        let seen = totals.passed().bytes + totals.dropped().bytes;
        let rx = match self.last_rx.replace((sysfs, seen)) {
            Some((s, x)) => sysfs.saturating_sub(s).max(seen.saturating_sub(x)).saturating_mul(8),
            None => return,
        };
        let own = if dropping.is_empty() { Vec::new() } else { own_addresses(&self.iface) };
        let rate = self.allowance.max(on.book.spec().packet_bytes);
        let rated: Vec<(Key, u64)> = dropping
            .iter()
            .map(|(net, class)| {
                let m = self.class_match.get(usize::from(*class)).cloned().unwrap_or_default();
                let mut key = Key::flow(*net);
                key.dest = own_destination(&own, net);
                key.protocol = m.protocol;
                key.source_ports = m.source_ports;
                key.ports = m.ports;
                (key, rate)
            })
            .collect();
        Self::sent(on);
        if on.book.second(crate::clock::unix_now(), rx, &rated) {
            self.push();
        }
    }

    /// Escalation denied a proven source for `ttl` seconds: announced too
    /// when the policy says `escalate = true` and the escalation is
    /// `bound` (its drops were segments of connections this host holds).
    fn escalated(&mut self, net: IpNet, ttl: u64, bound: bool) {
        let Some(on) = &mut self.on else { return };
        if !on.book.spec().escalate {
            return;
        }
        if !bound {
            tracing::info!(
                event = "upstream",
                "limiter: escalation of {net} not announced upstream: its drops were not of a connection this host \
                 holds (proof of source alone is not enough)"
            );
            return;
        }
        let now = crate::clock::unix_now();
        let rule = Rule {
            key: Key::flow(net),
            action: Action::Discard,
            by: Origin::Escalation,
            since: now,
            expires: super::expiry_from_now(ttl),
        };
        Self::sent(on);
        match on.book.add(rule) {
            Ok(true) => self.push(),
            Ok(false) => {}
            Err(e) => tracing::info!(event = "upstream", "limiter: escalation of {net} not announced upstream: {e}"),
        }
    }

    fn info(on: &On) -> UpstreamInfo {
        let spec = on.book.spec();
        UpstreamInfo {
            speaker: spec.speaker.display().to_string(),
            shadow: spec.shadow,
            max_rules: spec.max_rules,
            status: on.speaker.as_ref().map(Speaker::status).unwrap_or_default(),
            rules: on.book.rules().cloned().collect(),
            pressure: on.book.pressure,
        }
    }

    /// The operator's announcement.
    fn announce(&mut self, key: Key, rate: Option<u64>, ttl: Option<u64>) -> Response {
        let Some(on) = &mut self.on else { return no_section() };
        let (rule, ttl) = Self::operators(on, key, rate, ttl);
        let what = rule.describe();
        Self::sent(on);
        match on.book.add(rule) {
            Ok(_) => {
                tracing::info!(event = "upstream", "limiter: the operator asks upstream for {what} for {ttl} s");
                self.push();
                self.list()
            }
            Err(e) => {
                let (code, why) = refusal(&e);
                Response::error(code, why)
            }
        }
    }

    /// The operator's rule on `key`: discard, or at most `rate` bytes a
    /// second, for `ttl` seconds (`None`: the section's), and that time.
    fn operators(on: &On, key: Key, rate: Option<u64>, ttl: Option<u64>) -> (Rule, u64) {
        let now = crate::clock::unix_now();
        let ttl = ttl.unwrap_or(on.book.spec().ttl.as_secs());
        let action = rate.map_or(Action::Discard, |bytes_per_sec| Action::RateLimit { bytes_per_sec });
        (Rule { key, action, by: Origin::Operator, since: now, expires: super::expiry_from_now(ttl) }, ttl)
    }

    fn list(&self) -> Response {
        self.on.as_ref().map_or_else(no_section, |on| Response::Upstream(Self::info(on)))
    }
}

/// Why an operator's rule is refused, as the answer says it.
fn refusal(e: &Refusal) -> (ErrorCode, String) {
    let code = match e {
        Refusal::Cap { .. } | Refusal::PressureCap(_) => ErrorCode::Capped,
        Refusal::Protected { .. } | Refusal::Outranked { .. } => ErrorCode::Conflict,
        _ => ErrorCode::Refused,
    };
    (code, format!("not announced upstream: {e}"))
}

fn no_section() -> Response {
    Response::error(ErrorCode::Refused, "the policy has no [upstream] section: nothing is announced upstream")
}

impl Feature for UpstreamSide {
    fn apply(&mut self, a: &InForce<'_>) {
        let p = a.policy;
        let bytes = |l: &crate::policy::Limit, packet: u64| match l.cost {
            CostUnit::Packets => l.rate.saturating_mul(packet),
            CostUnit::Bytes => l.rate,
        };
        let allowed: Vec<IpNet> =
            p.overrides.iter().filter(|o| matches!(o.action, OverrideAction::Allow)).map(|o| o.net).collect();
        match (&mut self.on, &p.upstream) {
            (None, None) => {}
            (Some(_), None) => {
                tracing::info!(event = "upstream", "limiter: [upstream] removed: withdrawing every rule");
                if let Some(s) = self.on.take().and_then(|mut on| on.speaker.take()) {
                    stop_aside(s, true);
                }
            }
            (None, Some(spec)) => {
                let on = Self::start(spec, allowed);
                self.told = on.book.rules().map(|r| (r.key.clone(), r.clone())).collect();
                self.on = Some(on);
            }
            (Some(on), Some(spec)) => {
                let old = on.book.spec();
                if old.speaker != spec.speaker || old.state != spec.state {
                    if let Some(s) = on.speaker.take() {
                        stop_aside(s, true);
                    }
                    let on = Self::start(spec, allowed);
                    self.told = on.book.rules().map(|r| (r.key.clone(), r.clone())).collect();
                    self.on = Some(on);
                } else {
                    on.book.set((**spec).clone(), allowed);
                    self.push();
                }
            }
        }
        if let Some(on) = &self.on {
            let packet = on.book.spec().packet_bytes;
            self.allowance = std::iter::once(&p.default)
                .chain(p.classes.iter().map(|c| &c.limit))
                .fold(0u64, |sum, l| sum.saturating_add(bytes(l, packet)));
            self.class_match = std::iter::once(Match::default()).chain(p.classes.iter().map(Match::of)).collect();
        }
    }

    fn tick(&mut self, s: &Second<'_>) {
        if let Some(n) = self.pressure_prefixes() {
            self.second(s.totals, &s.dropping_most(n));
        }
        if let Some(on) = &mut self.on
            && on.book.expire(crate::clock::unix_now())
        {
            self.expiring = true;
            self.push();
        }
    }

    fn notes(&mut self) -> Vec<Note> {
        std::mem::take(&mut self.notes)
    }

    /// `prefix deny --upstream`: refused whole, before anything changes,
    /// when the rule could not be announced (no `[upstream]`, FlowSpec
    /// off, a protected or too wide network, the cap full of the
    /// operator's own rules).
    fn admits(&self, change: &Change) -> Result<(), (ErrorCode, String)> {
        let Change::Prefix { cidr, upstream: true, .. } = change else { return Ok(()) };
        let Some(on) = &self.on else {
            let why = "the policy has no [upstream] section: nothing is announced upstream; nothing changed";
            return Err((ErrorCode::Refused, why.into()));
        };
        let (rule, _) = Self::operators(on, Key::flow(*cidr), None, None);
        on.book.admits(&rule).map_err(|e| {
            let (code, why) = refusal(&e);
            (code, format!("{why}; nothing changed"))
        })
    }

    /// Escalation's denial, in force here: announced upstream too when the
    /// policy asks, and only when its drops were of connections this host
    /// holds (proof of source alone is not enough: a spoofer can send from
    /// a proven address); a refused one never is. The operator's `prefix
    /// deny --upstream`, applied here: announced, and said in its answer.
    fn applied(&mut self, a: &mut Applied<'_>) {
        match a.change {
            Change::Penalty { net: Ok(net), ttl, by: Origin::Escalation, held, .. } if a.ok => {
                self.escalated(*net, *ttl, *held);
            }
            Change::Prefix { cidr, ttl, upstream: true, .. } if a.ok => {
                let answer = self.announce(Key::flow(*cidr), None, *ttl);
                match (a.reply.as_deref_mut(), answer) {
                    (Some(Response::Applied(applied)), Response::Upstream(info)) => applied.upstream = Some(info),
                    (Some(reply), Response::Error { code, message, .. }) => {
                        let version = if let Response::Applied(ap) = reply { ap.version } else { 0 };
                        *reply = Response::error(code, format!("{cidr} is denied here (policy v{version}); {message}"));
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }

    fn answer(&mut self, req: &Request) -> Option<Response> {
        Some(match req {
            Request::UpstreamList => self.list(),
            Request::UpstreamAnnounce { cidr, blackhole, destination, protocol, rate_limit, ttl_secs } => {
                let mut key = if *blackhole { Key::blackhole(*cidr) } else { Key::flow(*cidr) };
                key.dest = destination.map(|d| d.trunc());
                if let Some(d) = key.dest
                    && d.addr().is_ipv4() != cidr.addr().is_ipv4()
                {
                    return Some(Response::error(
                        ErrorCode::Refused,
                        format!("not announced upstream: {}", Refusal::Family { net: *cidr, dest: d }),
                    ));
                }
                key.protocol = *protocol;
                if *blackhole && (key.dest.is_some() || key.protocol.is_some() || rate_limit.is_some()) {
                    return Some(Response::error(ErrorCode::Refused, "a blackhole is a destination only"));
                }
                self.announce(key, *rate_limit, *ttl_secs)
            }
            Request::UpstreamWithdraw { cidr } => {
                let Some(on) = &mut self.on else { return Some(no_section()) };
                let n = on.book.withdraw(*cidr);
                if n == 0 && cidr.is_some() {
                    return Some(Response::error(
                        ErrorCode::Refused,
                        format!("no rule of {} is announced", cidr.map(|c| c.to_string()).unwrap_or_default()),
                    ));
                }
                tracing::info!(event = "upstream", "limiter: the operator withdraws {n} upstream rule(s)");
                self.push();
                self.list()
            }
            _ => return None,
        })
    }

    /// The rules on the bucket prefix, or on a network holding it.
    fn show(&self, _src: &limiter_common::packet::Source, _in_force: &InForce<'_>, out: &mut PrefixShow) {
        let Some(on) = &self.on else { return };
        let cidr = out.cidr;
        out.upstream = on
            .book
            .rules()
            .filter(|r| r.key.net.contains(&cidr.addr()) || cidr.contains(&r.key.net))
            .cloned()
            .collect();
    }

    fn status(&self, status: &mut StatusInfo) {
        status.upstream = self.on.as_ref().map(|on| {
            let i = Self::info(on);
            let s = &i.status;
            let sessions: Vec<String> =
                s.neighbours.iter().map(|(n, up)| format!("{n} {}", if *up { "up" } else { "DOWN" })).collect();
            format!(
                "speaker {} {}{}, sessions: {}; {} rule(s) wanted of {} at most, {} announced, {} pending{}",
                i.speaker,
                if s.speaker_up { "up" } else { "DOWN" },
                if i.shadow { " (shadow: nothing is sent)" } else { "" },
                if sessions.is_empty() { "none".to_owned() } else { sessions.join(", ") },
                i.rules.len(),
                i.max_rules,
                s.announced,
                s.pending,
                if i.pressure.pressured { "; link pressure" } else { "" }
            )
        });
    }

    fn series(&self) -> Option<Box<dyn Series>> {
        let on = self.on.as_ref()?;
        let spec = on.book.spec();
        Some(Box::new(UpstreamReport {
            status: on.speaker.as_ref().map(Speaker::status).unwrap_or_default(),
            by_trigger: on.book.by_trigger(),
            max_rules: spec.max_rules,
            refused: on.book.refused.clone(),
            pressure: on.book.pressure,
            shadow: spec.shadow,
        }))
    }

    /// Stop the thread; withdraw everything first when the policy says
    /// `withdraw_on_stop` (else the rules stay with the speaker and the
    /// next run takes them up from the state file).
    fn drain(&mut self) -> Drain<'_> {
        let Some((speaker, withdraw)) =
            self.on.as_mut().and_then(|on| Some((on.speaker.take()?, on.book.spec().withdraw_on_stop)))
        else {
            return Box::pin(async {});
        };
        Box::pin(async move {
            let _ = tokio::task::spawn_blocking(move || speaker.stop(withdraw, STOP_WAIT)).await;
        })
    }
}
