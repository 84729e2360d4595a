//! Policy changes off the event loop. A change (apply a file, re-read the
//! policy, add or remove an override) can take seconds with 131,072
//! overrides: it runs on a blocking thread with the policy state and the
//! policy tables moved there, while the loop keeps serving status,
//! metrics, signals and other clients. Requests that need the policy state
//! meanwhile wait in a bounded queue, in order.

use std::collections::VecDeque;

use ipnet::IpNet;
use tokio::sync::oneshot;

use super::{ApplyError, Enforcer, Settings, source::SourceChange};
use crate::{
    control::{ErrorCode, Request, Response, server::Reply},
    dataplane::maps::Tables,
    origin::Origin,
    policy::{Action, CostUnit, Limit, Mode, OverrideAction, file},
};

/// Requests waiting for the policy state; more are refused at once.
const MAX_QUEUED: usize = 64;

/// A change of policy.
#[derive(Debug)]
pub(crate) enum Change {
    /// `policy apply`: text sent by the client, or re-read the daemon's
    /// own; `force`: past the guard against truncated files.
    Apply { name: String, text: Option<String>, force: bool },
    /// SIGHUP.
    Reload,
    /// `prefix set|allow|deny|unset`: the CIDR, and what to do with it
    /// (`None` = unset; a limit takes the default class's cost and mode
    /// when it runs), for `ttl` seconds (`None`: until unset); `upstream`:
    /// a deny announced upstream too (`prefix deny --upstream`).
    Prefix { cidr: IpNet, action: Option<OverrideAction>, ttl: Option<u64>, upstream: bool, reason: Option<String> },
    /// `prefix unset --origin NAME | --all`: every entry of these layers.
    UnsetAll { origins: Vec<Origin> },
    /// `prefix load`: allow or deny every CIDR, all or nothing.
    Load { cidrs: Vec<IpNet>, action: Action, ttl: Option<u64> },
    /// Runtime overrides whose time is up.
    Expire,
    /// A penalty from the tenant layer or the daemon's escalation (under
    /// the governor) on `net`, parsed where it came in (`Err`: the
    /// tenant's text, not a CIDR without host bits, which the governor
    /// refuses and counts); `held`: its evidence was drops of connections
    /// this host holds (an escalation's may be).
    Penalty { net: Result<IpNet, String>, ttl: u64, reason: String, by: Origin, held: bool },
    /// A source of decisions' change (a feed's version, a part of a
    /// CrowdSec pull).
    Source(Box<dyn SourceChange>),
}

impl Change {
    /// Who made it when no channel says (SIGHUP, expiry, a source, the
    /// daemon's escalation), and what it was, as the audit trail and the
    /// attack records say it (`policy`: the file and its hash, said of an
    /// applied reload or apply).
    pub(crate) fn describe(&self, policy: Option<&str>) -> (String, String) {
        let policy = policy.map_or_else(String::new, |p| format!(": {p}"));
        let ttl = |t: &Option<u64>| t.map_or_else(String::new, |t| format!(" ttl {t}"));
        match self {
            Change::Apply { name, text, force } => {
                let what = if text.is_some() { "policy apply (text sent)" } else { "policy apply (its file)" };
                ("operator".into(), format!("{what} {name}{}{policy}", if *force { " --force" } else { "" }))
            }
            Change::Reload => ("sighup".into(), format!("policy reload{policy}")),
            Change::Prefix { cidr, action, ttl: t, upstream, reason } => {
                let action = action.map_or_else(
                    || "unset".to_owned(),
                    |a| match a {
                        crate::policy::OverrideAction::Limit(l) => format!("set rate {} burst {}", l.rate, l.burst),
                        a => a.action().to_string(),
                    },
                );
                let up = if *upstream { " --upstream" } else { "" };
                let why = reason.as_ref().map_or_else(String::new, |r| format!(" reason {r:?}"));
                ("operator".into(), format!("prefix {action} {cidr}{}{up}{why}", ttl(t)))
            }
            Change::Load { cidrs, action, ttl: t } => {
                ("operator".into(), format!("prefix load {action} {} network(s){}", cidrs.len(), ttl(t)))
            }
            Change::Expire => ("expiry".into(), "what reached its end".into()),
            Change::UnsetAll { origins } => {
                let names: Vec<&str> = origins.iter().map(|o| o.label()).collect();
                ("operator".into(), format!("prefix unset every entry of {}", names.join(", ")))
            }
            Change::Penalty { net, ttl: t, reason, by, held } => {
                let net = net.as_ref().map_or_else(|text| format!("{text:?}"), ToString::to_string);
                let evidence = if *held { ", drops of connections this host holds" } else { "" };
                let who = if *by == Origin::Escalation { "escalation" } else { "tenant" };
                (who.into(), format!("penalty deny {net} ttl {t} reason {reason:?}{evidence}"))
            }
            Change::Source(c) => (c.origin().to_string(), "a new version".into()),
        }
    }
}

/// What waits for the policy state: a request that reads it, or a change
/// (with its client, if any).
pub(crate) enum Queued {
    Call(Request, Reply),
    Change(Change, Option<Reply>),
}

/// A finished change, with the state it had away.
pub(crate) struct Done {
    enforcer: Enforcer,
    tables: Tables,
    change: Change,
    reply: Option<Reply>,
    result: Result<String, ApplyError>,
}

/// Carry out `change` (on a blocking thread).
fn run(change: &mut Change, e: &mut Enforcer, t: &mut Tables, settings: &Settings) -> Result<String, ApplyError> {
    match change {
        // The text moves into the parsed policy (which keeps it): one copy.
        Change::Apply { name, text: Some(text), force } => {
            e.apply_guarded(t, file::parse(name, std::mem::take(text))?, *force)
        }
        Change::Apply { text: None, force, .. } => e.apply_guarded(t, settings.load_policy()?, *force),
        Change::Reload => e.apply_guarded(t, settings.load_policy()?, false),
        Change::Load { cidrs, action, ttl } => {
            let Some(action) = action.only(&[Action::Allow, Action::Deny]).ok().and_then(OverrideAction::of) else {
                return Err(ApplyError::Request(format!("prefix load: {action} is not allow or deny")));
            };
            e.load(t, cidrs, action, *ttl)
        }
        Change::UnsetAll { origins } => e.unset_all(t, origins),
        Change::Expire => {
            let now = crate::clock::unix_now();
            match (e.expire(t, now), e.deny_mut().expire(t, now)) {
                (Some(Ok(a)), Some(Ok(b))) => Ok(format!("{a}; {b}")),
                (Some(r), _) | (None, Some(r)) => r,
                (None, None) => Ok("nothing expired".into()),
            }
        }
        Change::Penalty { net, ttl, reason, by, .. } => e.penalize(t, net.as_ref(), *ttl, reason, *by),
        Change::Source(c) => c.run(e, t),
        Change::Prefix { cidr, action, ttl, reason, .. } => {
            let d = e.base().default;
            let action = action.map(|a| match a {
                OverrideAction::Limit(l) => {
                    OverrideAction::Limit(Limit { cost: d.cost, mode: d.mode, window: None, ..l })
                }
                a => a,
            });
            e.change_prefix(t, *cidr, action, *ttl, reason.as_deref())
        }
    }
}

impl Change {
    /// The change a request asks for, if it is one; a policy's text and a
    /// list's prefixes are taken out of the request, not copied.
    pub(crate) fn of(req: &mut Request) -> Option<Change> {
        // The operator's words reach log lines, `prefix list` and JSON: cut
        // and escaped on the way in, as the tenant's are.
        let why = |r: &Option<String>| r.as_deref().map(|r| crate::one_line(r, 800));
        let prefix = |cidr: &IpNet, action, ttl: &Option<u64>, reason: &Option<String>| {
            Some(Change::Prefix { cidr: *cidr, action, ttl: *ttl, upstream: false, reason: why(reason) })
        };
        match req {
            Request::PolicyApply { name, text, force } => {
                Some(Change::Apply { name: name.clone(), text: text.take(), force: *force })
            }
            Request::PrefixSet { cidr, rate, burst, ttl_secs, reason } => {
                // The class's cost and mode are the default class's, set when it runs.
                let limit =
                    Limit { rate: *rate, burst: *burst, cost: CostUnit::Packets, mode: Mode::Enforce, window: None };
                prefix(cidr, Some(OverrideAction::Limit(limit)), ttl_secs, reason)
            }
            Request::PrefixAllow { cidr, ttl_secs, reason } => {
                prefix(cidr, Some(OverrideAction::Allow), ttl_secs, reason)
            }
            Request::PrefixDeny { cidr, ttl_secs, upstream, reason } => Some(Change::Prefix {
                cidr: *cidr,
                action: Some(OverrideAction::Deny),
                ttl: *ttl_secs,
                upstream: *upstream,
                reason: why(reason),
            }),
            Request::PrefixUnset { cidr } => prefix(cidr, None, &None, &None),
            Request::PrefixUnsetAll { origins } => Some(Change::UnsetAll { origins: std::mem::take(origins) }),
            // The tenant's words reach log lines, `prefix list` and JSON:
            // control characters (a forged log line, terminal escapes) are
            // escaped on the way in.
            Request::Penalty { cidr, ttl_secs, reason } => Some(Change::Penalty {
                net: cidr.parse::<IpNet>().ok().filter(|n| n.trunc() == *n).ok_or_else(|| crate::escape_control(cidr)),
                ttl: *ttl_secs,
                reason: crate::escape_control(reason),
                by: Origin::Feedback,
                held: false,
            }),
            Request::PrefixLoad { cidrs, action, ttl_secs } => {
                Some(Change::Load { cidrs: std::mem::take(cidrs), action: *action, ttl: *ttl_secs })
            }
            _ => None,
        }
    }
}

/// Return the heap a big change freed (a parsed policy, the old tables)
/// to the system, so that resident memory after an apply is what the new
/// policy needs, not the peak.
fn give_back_memory() {
    // SAFETY: malloc_trim only releases free memory at the top of each
    // arena; it touches nothing in use.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The policy state and the changes of it: the state is home, or away
/// with the one change that runs; what needs it meanwhile waits here.
pub(crate) struct Changes {
    /// The policy state and the tables it writes; `None` while a change
    /// runs off the loop.
    policy: Option<(Enforcer, Tables)>,
    /// The change running off the loop, if any.
    running: Option<oneshot::Receiver<Done>>,
    queue: VecDeque<Queued>,
    /// The sources' changes still to apply: each starts only when
    /// nothing else runs or waits, so an operator's change waits for one
    /// part at most (not 1.2 s behind a whole 850,000-decision pull).
    /// Whole changes (a feed's version) go before the parts of a split
    /// one.
    whole: VecDeque<Box<dyn SourceChange>>,
    parts: VecDeque<Box<dyn SourceChange>>,
    /// When an expiry last went before a part (at most once a second).
    expired_between_parts: Option<std::time::Instant>,
}

impl Changes {
    pub(crate) fn new(enforcer: Enforcer, tables: Tables) -> Self {
        Self {
            policy: Some((enforcer, tables)),
            running: None,
            queue: VecDeque::new(),
            whole: VecDeque::new(),
            parts: VecDeque::new(),
            expired_between_parts: None,
        }
    }

    /// The policy state, when no change has it away.
    pub(crate) fn policy(&self) -> Option<&Enforcer> {
        self.policy.as_ref().map(|(p, _)| p)
    }

    /// Whether a change runs off the loop.
    pub(crate) fn running(&self) -> bool {
        self.running.is_some()
    }

    /// The change running off the loop, once it is done (cancel-safe: the
    /// loop's other arms may win meanwhile).
    pub(crate) async fn done(&mut self) -> Result<Done, oneshot::error::RecvError> {
        let done = self.running.as_mut().expect("awaited only while a change runs").await;
        self.running = None;
        done
    }

    /// Start `change` on a blocking thread, or queue it behind the one
    /// running.
    pub(crate) fn start(&mut self, change: Change, reply: Option<Reply>, settings: &Settings) {
        let Some((mut enforcer, mut tables)) = self.policy.take() else {
            // An expiry is retried by the next tick.
            if !matches!(change, Change::Expire) {
                self.enqueue(Queued::Change(change, reply));
            }
            return;
        };
        let settings = settings.clone();
        let (tx, rx) = oneshot::channel();
        tokio::task::spawn_blocking(move || {
            let mut change = change;
            let result = run(&mut change, &mut enforcer, &mut tables, &settings);
            let _ = tx.send(Done { enforcer, tables, change, reply, result });
        });
        self.running = Some(rx);
    }

    /// Queue a request until the policy state is back; refuse past the cap.
    pub(crate) fn enqueue(&mut self, q: Queued) {
        let reload = |q: &Queued| matches!(q, Queued::Change(Change::Reload, _));
        if reload(&q) && self.queue.iter().any(reload) {
            return;
        }
        if self.queue.len() >= MAX_QUEUED {
            if let Queued::Call(_, reply) | Queued::Change(_, Some(reply)) = q {
                let message = format!("{MAX_QUEUED} requests already wait for a policy change to finish; retry");
                let _ = reply.send(Response::error(ErrorCode::Busy, message));
            }
            return;
        }
        self.queue.push_back(q);
    }

    /// A change finished: the state is home again (and the heap a big
    /// change freed given back); what it was, who asked and its outcome.
    pub(crate) fn take_back(&mut self, done: Done) -> Finished {
        let Done { enforcer, tables, change, reply, result } = done;
        self.policy = Some((enforcer, tables));
        let frees = match &change {
            Change::Source(c) => c.frees_heap(),
            c => matches!(c, Change::Apply { .. } | Change::Reload | Change::Load { .. }),
        };
        if frees {
            give_back_memory();
        }
        Finished { change, reply, result }
    }

    /// What waited for the state, while no change has it away.
    pub(crate) fn next_queued(&mut self) -> Option<Queued> {
        if self.running.is_some() { None } else { self.queue.pop_front() }
    }

    /// A source's change: in line behind what waits, whole or in its
    /// parts (a newer version of what still waits replaces it).
    pub(crate) fn decided(&mut self, change: Box<dyn SourceChange>, settings: &Settings) {
        if let Some(slot) = self.whole.iter_mut().find(|w| change.replaces(&***w)) {
            *slot = change;
        } else {
            let parts = change.parts();
            if parts.len() == 1 {
                self.whole.extend(parts);
            } else {
                self.parts.append(&mut parts.into());
            }
        }
        self.next_part(settings);
    }

    /// Start the next part of a source's change, when nothing else runs
    /// or waits (parts of a section no longer in force are dropped).
    pub(crate) fn next_part(&mut self, settings: &Settings) {
        while self.running.is_none() && self.queue.is_empty() {
            // Overrides whose time is up go first (a long pull would
            // otherwise hold them past their end).
            let recently = self.expired_between_parts.is_some_and(|t| t.elapsed().as_secs() < 1);
            let waiting = !self.whole.is_empty() || !self.parts.is_empty();
            if waiting && !recently && self.expiry_due() {
                self.expired_between_parts = Some(std::time::Instant::now());
                self.start(Change::Expire, None, settings);
                continue;
            }
            let Some(part) = self.whole.pop_front().or_else(|| self.parts.pop_front()) else {
                return;
            };
            if part.current() {
                self.start(Change::Source(part), None, settings);
            }
        }
    }

    /// Once a second: start forgetting what reached its end (when no
    /// other change runs; it is one change for all of them).
    pub(crate) fn expire(&mut self, settings: &Settings) {
        if self.expiry_due() && self.running.is_none() {
            self.start(Change::Expire, None, settings);
        }
    }

    /// Whether an override, escalation or decision has reached its end.
    fn expiry_due(&self) -> bool {
        self.policy().and_then(Enforcer::next_expiry).is_some_and(|t| t <= crate::clock::unix_now())
    }
}

/// A change done, with its state home again.
pub(crate) struct Finished {
    pub(crate) change: Change,
    pub(crate) reply: Option<Reply>,
    pub(crate) result: Result<String, ApplyError>,
}
