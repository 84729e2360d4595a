//! Request criticality at the forwarder (seed 002): each connection is
//! `critical`, `default` or `sheddable`, by the most specific override of
//! its source that says (an `allow` says `critical`), else by the class
//! its SYN was charged to. At `max_connections` a share is kept for
//! critical connections (`critical_reserve`), and sheddable ones may hold
//! only `sheddable_share` of the cap, so they are refused first; under
//! adaptive throttling a sheddable connection is refused at twice the
//! probability, a critical one at half.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

use ipnet::IpNet;

use crate::policy::{Criticality, OverrideAction, Policy, forward::Forward};

/// What ranks a connection: the overrides that set a criticality, by
/// network, and each class's (index 0: the default class).
#[derive(Clone, Debug, Default)]
pub struct Ranks {
    overrides: HashMap<IpNet, Criticality>,
    /// Prefix lengths in `overrides`, longest first: (IPv4, IPv6).
    lens: (Vec<u8>, Vec<u8>),
    classes: Vec<Criticality>,
}

impl Ranks {
    /// The ranks of `policy` (the effective one: runtime overrides in).
    #[must_use]
    pub fn of(policy: &Policy) -> Self {
        let mut overrides = HashMap::new();
        for o in &policy.overrides {
            let c = o.criticality.or((o.action == OverrideAction::Allow).then_some(Criticality::Critical));
            if let Some(c) = c {
                overrides.insert(o.net, c);
            }
        }
        let mut lens = (Vec::new(), Vec::new());
        for net in overrides.keys() {
            let l = if net.addr().is_ipv4() { &mut lens.0 } else { &mut lens.1 };
            if !l.contains(&net.prefix_len()) {
                l.push(net.prefix_len());
            }
        }
        lens.0.sort_unstable_by(|a, b| b.cmp(a));
        lens.1.sort_unstable_by(|a, b| b.cmp(a));
        let classes =
            std::iter::once(Criticality::Default).chain(policy.classes.iter().map(|c| c.criticality)).collect();
        Self { overrides, lens, classes }
    }

    /// The criticality of a connection from `peer` whose SYN was
    /// charged to `class`.
    #[must_use]
    pub fn of_connection(&self, peer: SocketAddr, class: usize) -> Criticality {
        let ip = peer.ip().to_canonical();
        let lens = if ip.is_ipv4() { &self.lens.0 } else { &self.lens.1 };
        for &len in lens {
            if let Ok(net) = IpNet::new(ip, len)
                && let Some(c) = self.overrides.get(&net.trunc())
            {
                return *c;
            }
        }
        self.classes.get(class).copied().unwrap_or_default()
    }
}

/// A forwarder's connection slots, with a limit per criticality.
#[derive(Debug)]
pub struct Slots {
    open: AtomicUsize,
    /// Most open for (sheddable, default, critical).
    limits: [usize; 3],
}

/// A slot held; freed when dropped.
#[derive(Debug)]
pub struct Slot(Arc<Slots>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Slots {
    /// `max_connections`, less `critical_reserve` of it for all but
    /// critical connections, and at most `sheddable_share` of it for
    /// sheddable ones.
    #[must_use]
    pub fn new(cfg: &Forward) -> Arc<Self> {
        let max = cfg.max_connections;
        let reserve = share(max, cfg.critical_reserve.0, true);
        let default = max - reserve.min(max);
        let sheddable = share(max, cfg.sheddable_share.0, false).min(default);
        Arc::new(Self { open: AtomicUsize::new(0), limits: [sheddable, default, max] })
    }

    /// A slot for a connection of criticality `c`, if it is under its
    /// limit.
    pub fn take(self: &Arc<Self>, c: Criticality) -> Option<Slot> {
        let limit = self.limits[c as usize];
        self.open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < limit).then_some(n + 1)).ok()?;
        Some(Slot(Arc::clone(self)))
    }

    /// The limits, for the start-up log: (critical, default, sheddable).
    #[must_use]
    pub fn limits(&self) -> (usize, usize, usize) {
        (self.limits[2], self.limits[1], self.limits[0])
    }
}

/// `ratio` of `n`, rounded up or down.
fn share(n: usize, ratio: f64, up: bool) -> usize {
    let n32 = u32::try_from(n).unwrap_or(u32::MAX);
    let x = f64::from(n32) * ratio.clamp(0.0, 1.0);
    let r = if up { x.ceil() } else { x.floor() };
    // In 0..=n by the clamp.
    #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "0..=n")]
    let v = r as usize;
    v.min(n)
}

#[cfg(test)]
mod tests {
    use limiter_common::rules;

    use super::*;
    use crate::policy::forward::Ratio;

    fn fwd(max: usize, reserve: f64, sheddable: f64) -> Forward {
        let text = format!(
            "listen = [\"198.18.0.2:1\"]\nupstreams = [\"127.0.0.1:1\"]\nmax_connections = {max}\ncritical_reserve = {reserve:?}\nsheddable_share = {sheddable:?}\n"
        );
        let mut f: Forward = toml::from_str(&text).unwrap();
        (f.critical_reserve, f.sheddable_share) = (Ratio(reserve), Ratio(sheddable));
        f
    }

    #[test]
    fn sheddable_fill_their_share_default_leave_the_reserve_critical_take_the_rest() {
        let s = Slots::new(&fwd(20, 0.25, 0.5));
        assert_eq!(s.limits(), (20, 15, 10));
        let shed: Vec<Slot> = (0..30).filter_map(|_| s.take(Criticality::Sheddable)).collect();
        assert_eq!(shed.len(), 10);
        let default: Vec<Slot> = (0..30).filter_map(|_| s.take(Criticality::Default)).collect();
        assert_eq!(default.len(), 5);
        let critical: Vec<Slot> = (0..30).filter_map(|_| s.take(Criticality::Critical)).collect();
        assert_eq!(critical.len(), 5);
        drop(shed);
        // 10 open: at the sheddable share, so still none for them.
        assert!(s.take(Criticality::Sheddable).is_none(), "the share counts every open connection");
        drop(default);
        assert!(s.take(Criticality::Sheddable).is_some(), "freed slots are taken again");
    }

    #[test]
    fn an_allow_is_critical_an_override_says_its_own_and_the_class_decides_otherwise() {
        let text = "rate = 100\nburst = 100\n[[class]]\nname = \"web\"\nprotocol = \"tcp\"\nports = [443]\nsyn = true\nrate = 10\nburst = 10\ncriticality = \"sheddable\"\n\n[[override]]\ncidr = \"198.18.5.0/24\"\naction = \"allow\"\n\n[[override]]\ncidr = \"198.18.0.0/16\"\nrate = 5\nburst = 5\ncriticality = \"critical\"\n\n[[override]]\ncidr = \"198.18.6.0/24\"\nrate = 5\nburst = 5\ncriticality = \"sheddable\"\n";
        let p = crate::policy::file::parse("t", text.into()).unwrap().policy;
        let cfg = p.compile(1).unwrap().config;
        let r = Ranks::of(&p);
        let at = |a: &str, port| {
            let peer = SocketAddr::new(a.parse().unwrap(), 9999);
            let ctx = super::super::Context { config: cfg, ..Default::default() };
            let prefix = super::super::serve::prefix_of(peer, &ctx);
            r.of_connection(peer, rules::classify(&cfg, &super::super::serve::syn_source(prefix, port)))
        };
        assert_eq!(at("198.18.5.1", 443), Criticality::Critical);
        assert_eq!(at("198.18.7.1", 443), Criticality::Critical, "the /16's");
        assert_eq!(at("198.18.6.200", 80), Criticality::Sheddable, "the most specific override wins");
        assert_eq!(at("198.19.7.1", 443), Criticality::Sheddable, "the class's");
        assert_eq!(at("198.19.7.1", 80), Criticality::Default, "the default class");
        assert_eq!(at("::ffff:198.18.5.1", 443), Criticality::Critical, "a mapped address is its IPv4 one");
    }
}
