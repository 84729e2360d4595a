//! The tunnels as a feature of the daemon: on each policy, the services,
//! backends and Maglev tables written to the program's maps (a backend
//! keeps its index, and a service its table, while the policy keeps
//! them, so the connection table's entries stay right); each second the
//! health checks' results counted into rise and fall streaks, a backend
//! that changes state logged and its service's table written again; the
//! operator's drains (`limiter backend drain`), kept across reloads; the
//! series and `limiter status`'s line.

use std::{
    collections::{HashMap, HashSet},
    net::{IpAddr, SocketAddr},
};

use limiter_common::tunnel::{self as kernel, Service, ServiceKey};

use super::{
    BackendRate, BackendRow, TunnelRow, TunnelsInfo, health,
    maglev::{self, Member},
    maps::{Left, TunnelMaps},
    section::{self, Encapsulation, Otherwise, TooBig, Tunnel},
    series::TunnelReport,
};
use crate::{
    control::{ErrorCode, Request, Response, StatusInfo},
    engine::feature::{Feature, InForce, Note, Second},
    series::Series,
};

/// A backend as the feature follows it.
#[derive(Debug, Clone)]
struct Followed {
    addr: IpAddr,
    index: u32,
    weight: u32,
    /// Drained by the policy file.
    drain: bool,
    up: bool,
    /// Results in a row of the current kind (successes while down,
    /// failures while up).
    streak: u32,
    error: Option<String>,
    hits: limiter_common::Counter,
    /// `hits` at the last tick (`None` before its first).
    ticked: Option<limiter_common::Counter>,
    /// Packets and bytes forwarded to it between the last two ticks.
    rate: (u64, u64),
}

impl Followed {
    fn new(b: &section::BackendSpec, index: u32, up: bool) -> Self {
        Self {
            addr: b.address,
            index,
            weight: b.weight,
            drain: b.drain,
            up,
            streak: 0,
            error: None,
            hits: limiter_common::Counter::default(),
            ticked: None,
            rate: (0, 0),
        }
    }
}

/// A service as the feature follows it.
#[derive(Debug)]
struct Svc {
    spec: Tunnel,
    index: u32,
    members: Vec<Followed>,
    /// The table last written.
    table: Vec<u32>,
}

#[derive(Debug, Default)]
pub(crate) struct Tunnels {
    maps: Option<Box<TunnelMaps>>,
    services: Vec<Svc>,
    /// Drained by the operator, by address (every tunnel's backend at it).
    drained: Vec<IpAddr>,
    checks: Option<health::Checks>,
    /// The service keys written, to remove those a policy drops.
    keys: Vec<ServiceKey>,
    /// Each backend index's value as last written.
    written: HashMap<u32, kernel::Backend>,
    outcomes: Vec<u64>,
    notes: Vec<Note>,
    /// A map write that failed: said in status until one succeeds.
    failing: Option<String>,
    /// What the pinned maps held at the start (the daemon before this
    /// one wrote it), until the first policy takes it.
    left: Option<Left>,
}

fn octets(a: IpAddr) -> [u8; 16] {
    let mut out = [0; 16];
    match a {
        IpAddr::V4(v) => out[..4].copy_from_slice(&v.octets()),
        IpAddr::V6(v) => out = v.octets(),
    }
    out
}

fn state_name(state: u8) -> &'static str {
    match state {
        kernel::state::UP => "up",
        kernel::state::DOWN => "down",
        _ => "drained",
    }
}

impl Tunnels {
    pub(crate) fn new(maps: Option<Box<TunnelMaps>>) -> Self {
        let left = maps.as_ref().map(|m| m.left()).filter(|l| !l.backends.is_empty() || !l.services.is_empty());
        let mut t = Self { maps, ..Self::default() };
        if let Some(left) = left {
            // Written by the daemon before (the maps are pinned): what a
            // policy without them must take out.
            t.written = left.backends.iter().copied().collect();
            t.keys = left.services.iter().map(|(k, _)| *k).collect();
            t.left = Some(left);
        }
        t
    }

    fn state(&self, m: &Followed) -> u8 {
        if !m.up {
            kernel::state::DOWN
        } else if m.drain || self.drained.contains(&m.addr) {
            kernel::state::DRAINED
        } else {
            kernel::state::UP
        }
    }

    /// Take the policy's tunnels: indexes kept by name and address; on
    /// the first policy after a restart over pinned maps, the indexes,
    /// states and drains the maps hold, so each connection stays on its
    /// backend.
    fn take(&mut self, tunnels: &[Tunnel]) {
        let old: Vec<Svc> = std::mem::take(&mut self.services);
        let left = self.left.take().unwrap_or_default();
        // A service's index: kept by name, else the one the pinned maps
        // give its first port.
        let mut used = HashSet::new();
        let wanted: Vec<Option<u32>> = tunnels
            .iter()
            .map(|t| {
                let index = old.iter().find(|s| s.spec.name == t.name).map(|s| s.index).or_else(|| {
                    let (port, _) = t.ports.range().ok()?;
                    let v6 = u8::from(t.address.is_ipv6());
                    let k = ServiceKey { addr: octets(t.address), port, proto: t.protocol.number(), v6 };
                    left.services.iter().find(|(key, _)| *key == k).map(|(_, i)| *i)
                });
                index.filter(|i| used.insert(*i))
            })
            .collect();
        let mut free_svc: Vec<u32> = (0..kernel::MAX_SERVICES).filter(|i| !used.contains(i)).rev().collect();
        let indexes: Vec<u32> = wanted.iter().map(|w| w.or_else(|| free_svc.pop()).unwrap_or(0)).collect();
        // A backend's index: kept by tunnel and address, else the pinned
        // maps' entry of its address in its service.
        let mut used = HashSet::new();
        let mut restored = (0, 0, 0);
        let mut chosen: Vec<Vec<Option<Followed>>> = Vec::new();
        for (t, &si) in tunnels.iter().zip(&indexes) {
            let was = old.iter().find(|s| s.spec.name == t.name);
            let mut row = Vec::new();
            for b in &t.backends {
                let kept = was.and_then(|s| s.members.iter().find(|m| m.addr == b.address));
                let f = if let Some(m) = kept {
                    Some(Followed { weight: b.weight, drain: b.drain, ..m.clone() })
                } else if let Some((i, lb)) =
                    left.backends.iter().find(|(_, lb)| lb.service == si && lb.addr == octets(b.address))
                {
                    restored.0 += 1;
                    if lb.state == kernel::state::DRAINED && !b.drain && !self.drained.contains(&b.address) {
                        // The operator's drain, before the restart.
                        self.drained.push(b.address);
                        restored.1 += 1;
                    }
                    // Down stays down until its checks rise (without
                    // checks, nothing would bring it back).
                    let down = lb.state == kernel::state::DOWN && t.health.enabled;
                    restored.2 += usize::from(down);
                    Some(Followed::new(b, *i, !down))
                } else {
                    None
                };
                row.push(f.filter(|f| used.insert(f.index)));
            }
            chosen.push(row);
        }
        // New backends take indexes never written first, so a connection
        // left to a removed backend does not meet another at its index.
        let mut free: Vec<u32> = (0..kernel::MAX_BACKENDS).filter(|i| !used.contains(i)).collect();
        free.sort_by_key(|i| (!self.written.contains_key(i), std::cmp::Reverse(*i)));
        for ((t, &index), row) in tunnels.iter().zip(&indexes).zip(chosen) {
            let members = t
                .backends
                .iter()
                .zip(row)
                .map(|(b, f)| f.unwrap_or_else(|| Followed::new(b, free.pop().unwrap_or(0), true)))
                .collect();
            let table = old.iter().find(|s| s.spec.name == t.name).map(|s| s.table.clone()).unwrap_or_default();
            self.services.push(Svc { spec: t.clone(), index, members, table });
        }
        if restored.0 > 0 {
            let (n, drained, down) = restored;
            tracing::info!(
                event = "tunnel_state_restored",
                backends = n,
                drained,
                down,
                "limiter: tunnels: {n} backend(s) taken back from the pinned maps ({drained} drained by the operator, {down} down); their connections stay on them"
            );
        }
    }

    /// Write the maps from the services followed: each backend whose
    /// value changed (its kept next hops forgotten), each table's changed
    /// slots, and with `services` (a new policy: a health change or a
    /// drain leaves them as they are) the service keys.
    fn write(&mut self, services: bool) -> anyhow::Result<()> {
        let states: Vec<Vec<u8>> =
            self.services.iter().map(|s| s.members.iter().map(|m| self.state(m)).collect()).collect();
        let Some(maps) = self.maps.as_mut() else { return Ok(()) };
        let mut keys = Vec::new();
        for (s, states) in self.services.iter_mut().zip(&states) {
            for (m, state) in s.members.iter().zip(states) {
                let b = kernel::Backend { addr: octets(m.addr), state: *state, pad: [0; 3], service: s.index };
                if self.written.get(&m.index) != Some(&b) {
                    maps.backends.set(m.index, b, 0)?;
                    maps.forget_hop(m.index)?;
                    self.written.insert(m.index, b);
                }
            }
            let live: Vec<Member> = s
                .members
                .iter()
                .zip(states)
                .filter(|(_, st)| **st == kernel::state::UP)
                .map(|(m, _)| Member { addr: m.addr, index: m.index, weight: m.weight })
                .collect();
            let table = maglev::table(&live);
            let old = (s.table.len() == table.len()).then_some(s.table.as_slice());
            maps.write_table(s.index, &table, old)?;
            s.table = table;
            if !services {
                continue;
            }
            let t = &s.spec;
            let value = Service {
                index: s.index,
                encap: match t.encapsulation {
                    Encapsulation::Ipip => kernel::encap::IPIP,
                    Encapsulation::Fou => kernel::encap::FOU,
                    Encapsulation::Gue => kernel::encap::GUE,
                },
                flags: match t.too_big {
                    TooBig::Icmp => 0,
                    TooBig::Drop => kernel::service::TOO_BIG_DROP,
                    TooBig::Pass => kernel::service::TOO_BIG_PASS,
                } | if t.no_backend == Otherwise::Pass { kernel::service::EMPTY_PASS } else { 0 },
                ttl: t.ttl,
                v6: u8::from(t.address.is_ipv6()),
                port: t.encapsulation_port.unwrap_or(0),
                pad: 0,
                source: octets(t.source),
            };
            let (a, b) = t.ports.range().map_err(anyhow::Error::msg)?;
            let base = ServiceKey { addr: octets(t.address), port: 0, proto: 0, v6: u8::from(t.address.is_ipv6()) };
            // The address's own entry: its fragments are counted.
            keys.push(base);
            maps.services.insert(base, value, 0)?;
            for port in a..=b {
                let k = ServiceKey { port, proto: t.protocol.number(), ..base };
                maps.services.insert(k, value, 0)?;
                keys.push(k);
            }
        }
        // A backend no tunnel has now (removed, or left by the daemon
        // before): down, so the flows it held pick a backend again.
        let members: HashSet<u32> = self.services.iter().flat_map(|s| s.members.iter().map(|m| m.index)).collect();
        for (i, b) in &mut self.written {
            if !members.contains(i) && b.state != kernel::state::DOWN {
                b.state = kernel::state::DOWN;
                maps.backends.set(*i, *b, 0)?;
            }
        }
        if services {
            let now: HashSet<&ServiceKey> = keys.iter().collect();
            for k in self.keys.iter().filter(|k| !now.contains(k)) {
                let _ = maps.services.remove(k);
            }
            self.keys = keys;
        }
        Ok(())
    }

    /// [`Tunnels::write`]; after a failed write, everything again.
    fn write_or_say(&mut self, services: bool) {
        match self.write(services || self.failing.is_some()) {
            Ok(()) => self.failing = None,
            Err(e) => {
                tracing::error!(event = "tunnel_write_failed", "limiter: tunnels not written to the program: {e:#}");
                self.failing = Some(format!("{e:#}"));
            }
        }
    }

    /// Restart the health checks for the services followed.
    fn check(&mut self) {
        let targets = self
            .services
            .iter()
            .flat_map(|s| {
                let h = &s.spec.health;
                let port = s.spec.health_port();
                s.members
                    .iter()
                    .map(move |m| (m.index, SocketAddr::new(m.addr, port), h.interval, h.timeout, h.enabled))
            })
            .collect();
        self.checks = Some(health::start(targets));
    }

    /// Count the checks' results; a backend that changes state is logged
    /// and noted. Whether any did.
    fn count_results(&mut self) -> bool {
        let Some(checks) = self.checks.as_mut() else { return false };
        let mut changed = false;
        while let Ok(p) = checks.results.try_recv() {
            for s in &mut self.services {
                let (rise, fall) = (s.spec.health.rise, s.spec.health.fall);
                let Some(m) = s.members.iter_mut().find(|m| m.index == p.index) else { continue };
                if p.ok == m.up {
                    m.streak = 0;
                    if p.ok {
                        m.error = None;
                    }
                    continue;
                }
                m.streak += 1;
                if !p.ok {
                    m.error.clone_from(&p.error);
                }
                if m.streak < if m.up { fall } else { rise } {
                    continue;
                }
                m.up = !m.up;
                m.streak = 0;
                changed = true;
                let (name, addr) = (&s.spec.name, m.addr);
                if m.up {
                    tracing::info!(event = "tunnel_backend_up", tunnel = %name, backend = %addr, "limiter: tunnel {name}: backend {addr} is up, back in the table");
                } else {
                    let why = m.error.clone().unwrap_or_default();
                    tracing::warn!(event = "tunnel_backend_down", tunnel = %name, backend = %addr, "limiter: tunnel {name}: backend {addr} is down ({why}), out of the table");
                }
                let what = format!("tunnel {name}: backend {addr} {}", if m.up { "up" } else { "down" });
                self.notes.push(Note { by: "health check".to_owned(), what });
            }
        }
        changed
    }

    fn up_count(&self, s: &Svc) -> usize {
        s.members.iter().filter(|m| self.state(m) == kernel::state::UP).count()
    }

    fn info(&self) -> TunnelsInfo {
        let tunnels = self
            .services
            .iter()
            .map(|s| TunnelRow {
                name: s.spec.name.clone(),
                address: s.spec.address,
                protocol: s.spec.protocol,
                ports: s.spec.ports.range().unwrap_or((0, 0)),
                backends: s
                    .members
                    .iter()
                    .map(|m| BackendRow {
                        address: m.addr,
                        weight: m.weight,
                        state: state_name(self.state(m)).to_owned(),
                        packets: m.hits.packets,
                        bytes: m.hits.bytes,
                        error: m.error.clone(),
                    })
                    .collect(),
            })
            .collect();
        TunnelsInfo { tunnels, outcomes: self.outcomes.clone() }
    }

    /// Read what the program counted: per backend, and per outcome.
    fn refresh(&mut self) {
        if let Some(maps) = self.maps.as_ref() {
            for s in &mut self.services {
                for m in &mut s.members {
                    m.hits = maps.hits(m.index);
                }
            }
            self.outcomes = maps.outcomes();
        }
    }

    /// Each backend's packets and bytes since the last tick.
    fn rates(&mut self) {
        for m in self.services.iter_mut().flat_map(|s| &mut s.members) {
            if let Some(t) = m.ticked {
                m.rate = (m.hits.packets.saturating_sub(t.packets), m.hits.bytes.saturating_sub(t.bytes));
            }
            m.ticked = Some(m.hits);
        }
    }

    fn drain(&mut self, addr: IpAddr, on: bool) -> Response {
        if !self.services.iter().any(|s| s.members.iter().any(|m| m.addr == addr)) {
            return Response::error(ErrorCode::Refused, format!("{addr} is no tunnel's backend"));
        }
        self.drained.retain(|a| *a != addr);
        if on {
            self.drained.push(addr);
        }
        let what = format!("backend {addr} {}", if on { "drained" } else { "undrained" });
        tracing::info!(event = "tunnel_backend_drain", backend = %addr, drained = on, "limiter: {what}");
        self.write_or_say(false);
        if let Some(e) = &self.failing {
            return Response::error(ErrorCode::Unavailable, format!("{what}, but not written: {e}"));
        }
        Response::Tunnels(self.info())
    }
}

impl Feature for Tunnels {
    fn apply(&mut self, a: &InForce<'_>) {
        let tunnels = &a.policy.tunnels;
        let same =
            tunnels.len() == self.services.len() && tunnels.iter().zip(&self.services).all(|(t, s)| *t == s.spec);
        if same && self.left.is_none() {
            return;
        }
        self.take(tunnels);
        self.write_or_say(true);
        self.check();
    }

    fn tick(&mut self, _: &Second<'_>) {
        if self.count_results() {
            self.write_or_say(false);
            for s in &self.services {
                if self.up_count(s) == 0 {
                    tracing::error!(event = "tunnel_no_backend", tunnel = %s.spec.name, "limiter: tunnel {}: no backend up; its packets are {}", s.spec.name, if s.spec.no_backend == Otherwise::Pass { "passed to the stack" } else { "dropped" });
                }
            }
        }
        self.refresh();
        self.rates();
    }

    fn notes(&mut self) -> Vec<Note> {
        std::mem::take(&mut self.notes)
    }

    /// Always, the families without samples when no tunnel is declared:
    /// the alert rule and dashboards find the names on every daemon.
    fn series(&self) -> Option<Box<dyn Series>> {
        Some(Box::new(TunnelReport(self.info())))
    }

    fn status(&self, status: &mut StatusInfo) {
        if self.services.is_empty() {
            return;
        }
        let each: Vec<String> = self
            .services
            .iter()
            .map(|s| {
                let up = self.up_count(s);
                let empty = if up == 0 { " NO BACKEND UP" } else { "" };
                format!("{} {}/{} up{empty}", s.spec.name, up, s.members.len())
            })
            .collect();
        let failing = self.failing.as_ref().map(|e| format!("; NOT WRITTEN: {e}")).unwrap_or_default();
        status.tunnels = Some(format!("{}{failing}", each.join(", ")));
    }

    /// Every backend, the busiest first.
    fn top(&self, top: &mut crate::control::TopInfo) {
        let mut rows: Vec<BackendRate> = self
            .services
            .iter()
            .flat_map(|s| {
                s.members.iter().map(|m| BackendRate {
                    tunnel: s.spec.name.clone(),
                    backend: m.addr,
                    state: state_name(self.state(m)).to_owned(),
                    packets_per_sec: m.rate.0,
                    bytes_per_sec: m.rate.1,
                })
            })
            .collect();
        rows.sort_by_key(|b| std::cmp::Reverse(b.packets_per_sec));
        top.backends = rows;
    }

    fn answer(&mut self, req: &Request) -> Option<Response> {
        match req {
            Request::Tunnels => {
                self.refresh();
                Some(Response::Tunnels(self.info()))
            }
            Request::BackendDrain { address, drain } => Some(self.drain(*address, *drain)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The section tests' tunnel, with a third backend.
    fn web() -> Tunnel {
        let mut t = section::tests::web();
        t.backends.push(section::BackendSpec { address: IpAddr::from([198, 18, 2, 4]), weight: 1, drain: false });
        t
    }

    fn backend(last: u8, state: u8) -> kernel::Backend {
        kernel::Backend { addr: octets(IpAddr::from([198, 18, 2, last])), state, pad: [0; 3], service: 3 }
    }

    #[test]
    fn a_restart_takes_back_the_indexes_states_and_drains_the_pinned_maps_hold() {
        let key = ServiceKey { addr: octets(IpAddr::from([198, 18, 0, 2])), port: 80, proto: 6, v6: 0 };
        let left = Left {
            // .2 drained by the operator, .3 down; .9 no longer in the pool.
            backends: vec![
                (7, backend(2, kernel::state::DRAINED)),
                (9, backend(3, kernel::state::DOWN)),
                (0, backend(9, kernel::state::UP)),
            ],
            services: vec![(key, 3)],
        };
        let mut t = Tunnels::new(None);
        t.written = left.backends.iter().copied().collect();
        t.left = Some(left);
        t.take(&[web()]);
        let s = &t.services[0];
        assert_eq!(s.index, 3, "the service keeps its table");
        let got: Vec<(u32, bool)> = s.members.iter().map(|m| (m.index, m.up)).collect();
        // The new backend takes an index never written (not 0, where the
        // removed backend's connections may still point).
        assert_eq!(got, [(7, true), (9, false), (1, true)]);
        assert_eq!(t.drained, [IpAddr::from([198, 18, 2, 2])], "the operator's drain is back");
        assert!(t.left.is_none(), "taken once");

        // Without checks, a backend left down would never come back: up.
        let mut unchecked = web();
        unchecked.health.enabled = false;
        let mut t = Tunnels::new(None);
        t.left = Some(Left { backends: vec![(9, backend(3, kernel::state::DOWN))], services: vec![(key, 3)] });
        t.take(&[unchecked]);
        assert!(t.services[0].members[1].up);
    }
}
