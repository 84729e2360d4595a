//! What the daemon's loop shows of the policy in force (`status`, the
//! metrics, the fleet's classes), refreshed after start and each change.

use super::features::Features;
use crate::engine::{Enforcer, feature::InForce};
use crate::{feedback::FeedbackCounts, policy::Policy};

/// What the loop shows of the policy, kept while a change has it away.
#[derive(Debug, Default)]
pub(super) struct View {
    pub(super) version: u64,
    pub(super) source: String,
    /// The effective policy's summary line.
    pub(super) summary: String,
    /// Class names by index (0 = `default`).
    pub(super) class_names: Vec<String>,
    /// The feedback governor's decisions.
    pub(super) feedback: FeedbackCounts,
    /// Classes with SYN cookies: index, name and mode (`limiter_common::cookie::mode`),
    /// and whether the data plane has them on.
    pub(super) syn_cookies: Vec<(u32, String, u8)>,
    /// Each class that judges out-of-state TCP: index, name, mode.
    pub(super) tcp_state: Vec<(u32, String, u8)>,
    pub(super) syn_cookies_on: bool,
    /// The deny set's origins: index, name, networks.
    pub(super) deny: Vec<(u16, String, usize)>,
    /// The groups' names, by index.
    pub(super) groups: Vec<String>,
}

impl View {
    /// What the loop shows of the policy state `p`, and the effective
    /// policy (the file's with the runtime overrides) it was read from.
    pub(super) fn of(p: &Enforcer) -> (Self, Policy) {
        let effective = p.effective(p.base());
        let cookies_on = p.config().is_some_and(|c| c.flags & limiter_common::flags::SYN_COOKIES != 0);
        let view = View {
            version: p.version(),
            source: p.source().to_owned(),
            summary: match p.syn_cookies_off() {
                Some(why) => format!("{}; syn cookies OFF: {why}", effective.summary(p.version())),
                None => effective.summary(p.version()).to_string(),
            },
            class_names: effective.class_names().into_iter().map(str::to_owned).collect(),
            feedback: {
                let g = p.governed();
                FeedbackCounts { applied: g.applied, shadowed: g.shadowed, refused: g.refused }
            },
            syn_cookies: p.config().map_or_else(Vec::new, |c| {
                (0u32..)
                    .zip(effective.class_names())
                    .zip(c.cookies.mode)
                    .filter(|(_, m)| *m != limiter_common::cookie::mode::OFF)
                    .map(|((i, n), m)| (i, n.to_owned(), m))
                    .collect()
            }),
            syn_cookies_on: cookies_on,
            tcp_state: p.config().map_or_else(Vec::new, |c| {
                (0u32..)
                    .zip(effective.class_names())
                    .map(|(i, n)| (i, n.to_owned(), limiter_common::tcp_state::of(c.flags, i as usize)))
                    .filter(|(_, _, m)| *m != limiter_common::tcp_state::mode::OFF)
                    .collect()
            }),
            deny: {
                let layer = p.deny_layer();
                let counts = layer.counts();
                layer.origins().map(|(i, name)| (i, name.clone(), counts.get(name).copied().unwrap_or(0))).collect()
            },
            groups: effective.groups.iter().map(|g| g.name.clone()).collect(),
        };
        (view, effective)
    }

    /// Show the policy state `p` in force (after start and each change),
    /// and hand it to every feature: from here and from nowhere else.
    pub(super) fn refresh(&mut self, p: &Enforcer, features: &mut Features) {
        let (view, effective) = View::of(p);
        *self = view;
        features.apply(&self.applied(p, &effective));
    }

    /// SIGHUP: every feature reads its own files again.
    pub(super) fn reload(&self, p: &Enforcer, features: &mut Features) {
        let effective = p.effective(p.base());
        features.reload(&self.applied(p, &effective));
    }

    /// The policy in force as the features take it.
    pub(super) fn applied<'a>(&'a self, p: &'a Enforcer, effective: &'a Policy) -> InForce<'a> {
        InForce {
            version: self.version,
            policy: effective,
            config: p.config().copied().unwrap_or_default(),
            class_names: &self.class_names,
            state: p,
        }
    }
}
