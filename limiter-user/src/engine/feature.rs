//! The daemon's features (the forwarders, the fleet sync, the feedback
//! endpoint, the feed watcher, the groups, CrowdSec's pulls, the upstream
//! speaker, escalation) behind one small face: each starts from the policy
//! in force (a decider with a [`Sink`](super::decision::Sink) for its
//! changes), is told the policy after every change and every change that
//! finished (who made it, and whether it was applied), may refuse an
//! operator's change it cannot do its part of, asked to read its files
//! again on SIGHUP, ticked once a second with what the data plane did in
//! it, told of each drop the program sampled, asked at each scrape for
//! its report (which writes its own series) and for its part of `limiter
//! status`, may answer the control requests that are its own, and is
//! drained at shutdown. A policy change fans out to every feature from one
//! place (the daemon's `View::refresh` through `Features::apply`), so a setting of a
//! feature goes one way, once: file -> policy -> [`InForce`] -> the
//! feature. A new feature is its own files and one line in
//! the daemon's `Features::start`; the loop names
//! none of them (it asks the list, never one feature by its type).

use std::pin::Pin;

use ipnet::IpNet;
use limiter_common::Config;

use super::{Enforcer, changes::Change};
use crate::{
    control::{ErrorCode, PrefixShow, Request, Response, StatusInfo, TopInfo},
    dataplane::Totals,
    origin::Named,
    policy::Policy,
    series::Series,
    top::Tracker,
};

/// The policy in force, as every feature sees it.
pub(crate) struct InForce<'a> {
    pub(crate) version: u64,
    /// The effective policy: the file's, with the runtime overrides.
    pub(crate) policy: &'a Policy,
    /// What the data plane enforces of it.
    pub(crate) config: Config,
    /// Class names by index (0 = `default`).
    pub(crate) class_names: &'a [String],
    /// The policy state it came from (what each source's changes did).
    pub(crate) state: &'a Enforcer,
}

/// A second of the data plane, as every feature is told of it.
pub(crate) struct Second<'a> {
    /// What the program counted since it started.
    pub(crate) totals: &'a Totals,
    /// The sampled drops (for `limiter top`).
    pub(crate) top: &'a Tracker,
    /// Each class with SYN cookies and whether they are engaged now.
    pub(crate) syn_cookies: &'a [crate::control::SynCookieRow],
    /// Each class that judges out-of-state TCP, and whether it does now.
    pub(crate) tcp_state: &'a [crate::control::TcpStateRow],
}

impl Second<'_> {
    /// The `n` prefixes the program drops most now, each with its class
    /// index.
    pub(crate) fn dropping_most(&self, n: usize) -> Vec<(IpNet, u8)> {
        self.top
            .offenders(crate::clock::unix_now(), n)
            .into_iter()
            .map(|(k, _)| (crate::dataplane::net(&k), k.class))
            .collect()
    }
}

/// One drop the program sampled (one in `drop_sample`, at random), or a verified
/// SYN cookie, as every feature hears of it when the loop drains them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sample {
    /// Its bucket.
    pub(crate) key: limiter_common::BucketKey,
    /// Its source address (`None` from a program of a build before
    /// addresses were sent).
    pub(crate) src: Option<std::net::IpAddr>,
    /// A segment of a connection this host holds.
    pub(crate) held: bool,
    /// Its [`Reason`](limiter_common::Reason), as the program wrote it.
    pub(crate) reason: u32,
    /// When it was drained (Unix seconds).
    pub(crate) at: u64,
    /// Its IP protocol and destination port, when the program read one.
    pub(crate) port: Option<(u8, u16)>,
}

/// A change that finished, as every feature is told of it.
pub(crate) struct Applied<'a> {
    pub(crate) change: &'a Change,
    /// Who asked for it, if somebody did on a channel (a control client,
    /// the tenant layer); else the change says who made it.
    pub(crate) by: Option<&'a crate::control::server::Requester>,
    /// Applied (or refused).
    pub(crate) ok: bool,
    /// The summary of the version it made, or why it was refused.
    pub(crate) line: &'a str,
    /// Why the feedback governor refused it, if it refused a penalty.
    pub(crate) refusal: Option<crate::policy::feedback::Refusal>,
    /// The answer to the client who asked for it, if one did: a feature
    /// that carries out its part of the change says so in it (the
    /// upstream speaker, `prefix deny --upstream`'s announcement).
    pub(crate) reply: Option<&'a mut Response>,
}

impl Applied<'_> {
    /// The source of decisions that sent it (its
    /// [`origin`](super::source::SourceChange::origin), `feed:NAME`), if a
    /// source's.
    pub(crate) fn origin(&self) -> Option<Named> {
        match self.change {
            Change::Source(c) => Some(c.origin()),
            _ => None,
        }
    }
}

/// A request a feature answered that changed something the policy state
/// does not hold (an operator's announcement or withdrawal upstream):
/// what it was, whether it was done, and the answer's summary (`None`:
/// not such a request).
pub(crate) fn answered_change(req: &Request, answer: &Response) -> Option<(String, bool, String)> {
    let change = match req {
        Request::UpstreamAnnounce { cidr, blackhole, ttl_secs, .. } => {
            let what = if *blackhole { "blackhole" } else { "announce" };
            let ttl = ttl_secs.map_or_else(String::new, |t| format!(" ttl {t}"));
            format!("upstream {what} {cidr}{ttl}")
        }
        Request::UpstreamWithdraw { cidr } => {
            format!("upstream withdraw {}", cidr.map_or_else(|| "--all".to_owned(), |c| c.to_string()))
        }
        _ => return None,
    };
    let (ok, result) = match answer {
        Response::Error { message, .. } => (false, message.clone()),
        Response::Upstream(u) => (true, format!("{} rule(s) wanted upstream", u.rules.len())),
        _ => (true, String::new()),
    };
    Some((change, ok, result))
}

/// Something a feature did on its own that is no change of the policy
/// state (automation's rules announced upstream, and withdrawn): the
/// audit trail and the attack records hear of it as of a change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Note {
    /// Who decided it, as the trail names authors (`pressure`,
    /// `escalation`, `expiry`).
    pub(crate) by: String,
    pub(crate) what: String,
}

/// Networks described a drain at most (see [`Feature::wants_described`]).
pub(crate) const DESCRIBED: usize = 16;

/// What a feature's drain waits for.
pub(crate) type Drain<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// A subsystem of the daemon.
pub(crate) trait Feature: Send {
    /// Take the policy in force: start, change or stop what it declares.
    fn apply(&mut self, applied: &InForce<'_>);

    /// SIGHUP, after the policy was read again: read again what the
    /// feature reads from files of its own.
    fn reload(&mut self, _applied: &InForce<'_>) {}

    /// Once a second, on the daemon's loop (never blocking it), with
    /// what the data plane did.
    fn tick(&mut self, _second: &Second<'_>) {}

    /// What it did on its own since it was last asked (asked after every
    /// feature's tick; each note is then told to every feature).
    fn notes(&mut self) -> Vec<Note> {
        Vec::new()
    }

    /// A feature's note (see [`Feature::notes`]).
    fn noted(&mut self, _note: &Note) {}

    /// A sampled drop, as the loop drains them (every 200 ms).
    fn sampled(&mut self, _sample: &Sample) {}

    /// Frames the data plane copied, as the loop drains them (every
    /// 200 ms), with the policy's class names by index.
    fn frames(&mut self, _frames: &[crate::capture::Frame], _class_names: &[String]) {}

    /// Networks (bucket prefixes) it wants the features to describe, as
    /// `limiter prefix show` does (their country and AS): asked at every
    /// drain of the sampled drops (every 200 ms), at most [`DESCRIBED`]
    /// told each time.
    fn wants_described(&mut self) -> Vec<ipnet::IpNet> {
        Vec::new()
    }

    /// What the features said of a network it asked of.
    fn described(&mut self, _net: ipnet::IpNet, _show: &PrefixShow) {}

    /// Which dropped frames it wants the data plane to copy now (`None`:
    /// none).
    fn wants_frames(&self) -> Option<crate::capture::Want> {
        None
    }

    /// How many passed frames a second it wants copied now, drawn at
    /// random (`None`: none).
    fn wants_passes(&self) -> Option<u64> {
        None
    }

    /// Whether it can carry out its part of a change the operator asks
    /// for (`Err`: why not, the answer refusing the whole change before
    /// anything changed).
    fn admits(&self, _change: &Change) -> Result<(), (ErrorCode, String)> {
        Ok(())
    }

    /// A change finished (whoever made it: the operator, a source, the
    /// escalation): applied or refused.
    fn applied(&mut self, _applied: &mut Applied<'_>) {}

    /// Its settings that take a restart, as in force where the policy
    /// shown (`policy`, the file's) says otherwise: set in it, and said in
    /// `note`.
    fn in_force(&self, _policy: &mut Policy, _note: &mut String) {}

    /// Its report for a scrape, which writes its own series (`None`:
    /// nothing to show now).
    fn series(&self) -> Option<Box<dyn Series>> {
        None
    }

    /// Its part of `limiter status`.
    fn status(&self, _status: &mut StatusInfo) {}

    /// Its part of `limiter top`.
    fn top(&self, _top: &mut TopInfo) {}

    /// What it says of the bucket prefix of `src` in `limiter prefix show`.
    fn show(&self, _src: &limiter_common::packet::Source, _in_force: &InForce<'_>, _out: &mut PrefixShow) {}

    /// The answer to a control request that is its own (`None`: not its).
    fn answer(&mut self, _req: &Request) -> Option<Response> {
        None
    }

    /// A feature answered `req` of `by` with `answer` (the audit trail
    /// records those that change something: an upstream announcement).
    fn answered(&mut self, _req: &Request, _by: &crate::control::server::Requester, _answer: &Response) {}

    /// Let what is in flight finish, each within its own bound.
    fn drain(&mut self) -> Drain<'_> {
        Box::pin(async {})
    }
}

/// A feature the policy may leave out.
impl<T: Feature> Feature for Option<T> {
    fn apply(&mut self, applied: &InForce<'_>) {
        if let Some(f) = self {
            f.apply(applied);
        }
    }

    fn reload(&mut self, applied: &InForce<'_>) {
        if let Some(f) = self {
            f.reload(applied);
        }
    }

    fn tick(&mut self, second: &Second<'_>) {
        if let Some(f) = self {
            f.tick(second);
        }
    }

    fn sampled(&mut self, sample: &Sample) {
        if let Some(f) = self {
            f.sampled(sample);
        }
    }

    fn notes(&mut self) -> Vec<Note> {
        self.as_mut().map(Feature::notes).unwrap_or_default()
    }

    fn noted(&mut self, note: &Note) {
        if let Some(f) = self {
            f.noted(note);
        }
    }

    fn admits(&self, change: &Change) -> Result<(), (ErrorCode, String)> {
        self.as_ref().map_or(Ok(()), |f| f.admits(change))
    }

    fn applied(&mut self, applied: &mut Applied<'_>) {
        if let Some(f) = self {
            f.applied(applied);
        }
    }

    fn in_force(&self, policy: &mut Policy, note: &mut String) {
        if let Some(f) = self {
            f.in_force(policy, note);
        }
    }

    fn series(&self) -> Option<Box<dyn Series>> {
        self.as_ref().and_then(Feature::series)
    }

    fn status(&self, status: &mut StatusInfo) {
        if let Some(f) = self {
            f.status(status);
        }
    }

    fn top(&self, top: &mut TopInfo) {
        if let Some(f) = self {
            f.top(top);
        }
    }

    fn show(&self, src: &limiter_common::packet::Source, in_force: &InForce<'_>, out: &mut PrefixShow) {
        if let Some(f) = self {
            f.show(src, in_force, out);
        }
    }

    fn answer(&mut self, req: &Request) -> Option<Response> {
        self.as_mut().and_then(|f| f.answer(req))
    }

    fn drain(&mut self) -> Drain<'_> {
        match self {
            Some(f) => f.drain(),
            None => Box::pin(async {}),
        }
    }
}
