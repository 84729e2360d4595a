//! `[[tunnel]]`: a destination (address, protocol, ports) whose packets
//! the program forwards at the driver, wrapped to one of a pool of
//! backends, once the limiter has admitted them.
//!
//! ```toml
//! [[tunnel]]
//! name = "web"
//! address = "198.18.0.2"       # the service address clients reach
//! protocol = "tcp"             # tcp | udp
//! ports = "443"                # one port, or a range "8000-8099"
//! encapsulation = "ipip"       # ipip (default) | fou | gue; IPv6: ipip only
//! encapsulation_port = 5555    # fou and gue: the backends' UDP port
//! source = "198.18.1.1"        # the outer header's source: this host's address
//! ttl = 64                     # the outer header's TTL
//! too_big = "icmp"             # a packet too big for the path once wrapped: icmp | drop | pass
//! no_backend = "drop"          # every backend down or drained: drop | pass
//! backends = [
//!   { address = "198.18.2.2" },
//!   { address = "198.18.2.3", weight = 2 },
//!   { address = "198.18.2.4", drain = true },   # keeps its flows, gets no new ones
//! ]
//! [tunnel.health]              # a TCP connect to each backend
//! port = 80                    # default: the first of `ports`
//! interval = "1s"
//! timeout = "1s"
//! rise = 2                     # successes in a row that bring a backend up
//! fall = 2                     # failures in a row that take it out
//! ```

use std::{collections::HashSet, net::IpAddr, time::Duration};

use limiter_common::tunnel::{MAX_BACKENDS, MAX_SERVICES, SERVICE_PORTS};
use serde::{Deserialize, Serialize};

use crate::policy::{
    duration::{duration, duration_out},
    error::{PolicyError, bad},
    words::valid_name,
};

/// The transport a tunnel forwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    Tcp,
    Udp,
}

impl Transport {
    #[must_use]
    pub const fn number(self) -> u8 {
        match self {
            Self::Tcp => 6,
            Self::Udp => 17,
        }
    }
}

/// How packets are wrapped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encapsulation {
    #[default]
    Ipip,
    Fou,
    Gue,
}

/// What happens to a packet too big for the path once wrapped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TooBig {
    /// Answered with ICMP's "fragmentation needed" (ICMPv6's "packet too
    /// big") from the service address: the client's path MTU discovery
    /// shrinks its packets.
    #[default]
    Icmp,
    Drop,
    Pass,
}

/// What happens to a packet the tunnel cannot send.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Otherwise {
    #[default]
    Drop,
    Pass,
}

/// `ports`: one port (a number or a string) or a range `"A-B"`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Ports {
    One(u16),
    Text(String),
}

impl Ports {
    /// The first and last port.
    pub fn range(&self) -> Result<(u16, u16), String> {
        let one = |s: &str| s.trim().parse::<u16>().map_err(|_| format!("\"{s}\" is not a port"));
        let (a, b) = match self {
            Self::One(p) => (*p, *p),
            Self::Text(t) => match t.split_once('-') {
                Some((a, b)) => (one(a)?, one(b)?),
                None => (one(t)?, one(t)?),
            },
        };
        if a == 0 || b < a {
            return Err(format!("{a}-{b} is not a range of ports 1-65535"));
        }
        Ok((a, b))
    }
}

/// One backend.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendSpec {
    pub address: IpAddr,
    /// Its share of new flows, relative to the others' (1-100).
    #[serde(default = "defaults::weight")]
    pub weight: u32,
    /// Keeps its flows, gets no new ones.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub drain: bool,
}

/// The health check: a TCP connect to each backend.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Health {
    /// Default: the first of the tunnel's ports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(default = "defaults::interval", deserialize_with = "duration", serialize_with = "duration_out")]
    pub interval: Duration,
    #[serde(default = "defaults::interval", deserialize_with = "duration", serialize_with = "duration_out")]
    pub timeout: Duration,
    #[serde(default = "defaults::count")]
    pub rise: u32,
    #[serde(default = "defaults::count")]
    pub fall: u32,
    /// `false`: no checks, every backend is up.
    #[serde(default = "defaults::on")]
    pub enabled: bool,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            port: None,
            interval: defaults::interval(),
            timeout: defaults::interval(),
            rise: defaults::count(),
            fall: defaults::count(),
            enabled: true,
        }
    }
}

/// One `[[tunnel]]` section.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tunnel {
    pub name: String,
    pub address: IpAddr,
    pub protocol: Transport,
    pub ports: Ports,
    #[serde(default)]
    pub encapsulation: Encapsulation,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encapsulation_port: Option<u16>,
    pub source: IpAddr,
    #[serde(default = "defaults::ttl")]
    pub ttl: u8,
    #[serde(default)]
    pub too_big: TooBig,
    #[serde(default)]
    pub no_backend: Otherwise,
    pub backends: Vec<BackendSpec>,
    #[serde(default)]
    pub health: Health,
}

impl Tunnel {
    /// The port the health check connects to.
    #[must_use]
    pub fn health_port(&self) -> u16 {
        self.health.port.unwrap_or_else(|| self.ports.range().map_or(0, |(a, _)| a))
    }
}

mod defaults {
    use std::time::Duration;

    pub const fn weight() -> u32 {
        1
    }
    pub const fn ttl() -> u8 {
        64
    }
    pub const fn interval() -> Duration {
        Duration::from_secs(1)
    }
    pub const fn count() -> u32 {
        2
    }
    pub const fn on() -> bool {
        true
    }
}

/// Largest weight of a backend.
pub const MAX_WEIGHT: u32 = 100;

/// Check every tunnel: names, families, ports, backends.
pub fn check(tunnels: &[Tunnel]) -> Result<(), PolicyError> {
    if tunnels.len() > MAX_SERVICES as usize {
        return Err(bad("tunnel", format!("{} tunnels, at most {MAX_SERVICES}", tunnels.len())));
    }
    let (mut names, mut dests, mut ports, mut backends) = (HashSet::new(), HashSet::new(), 0usize, 0usize);
    for (i, t) in tunnels.iter().enumerate() {
        let at = |f: &str| format!("tunnel[{i}].{f}");
        if !valid_name(&t.name) {
            return Err(bad(at("name"), format!("\"{}\" is not a name (letters, digits, - and _)", t.name)));
        }
        if !names.insert(t.name.as_str()) {
            return Err(bad(at("name"), format!("\"{}\" twice", t.name)));
        }
        let (a, b) = t.ports.range().map_err(|e| bad(at("ports"), e))?;
        for p in a..=b {
            if !dests.insert((t.address, t.protocol, p)) {
                return Err(bad(at("ports"), format!("{} {p} is another tunnel's too", t.address)));
            }
        }
        // One entry per port, and one for the address (its fragments).
        ports += usize::from(b - a) + 2;
        if ports > SERVICE_PORTS as usize {
            return Err(bad(at("ports"), format!("the tunnels name more than {SERVICE_PORTS} ports together")));
        }
        let v6 = t.address.is_ipv6();
        if t.source.is_ipv6() != v6 {
            return Err(bad(at("source"), format!("{} is not of the address's family ({})", t.source, t.address)));
        }
        if v6 && t.encapsulation != Encapsulation::Ipip {
            return Err(bad(at("encapsulation"), "an IPv6 tunnel is ipip only (FOU and GUE over IPv6 are not sent)"));
        }
        match (t.encapsulation, t.encapsulation_port) {
            (Encapsulation::Ipip, Some(_)) => {
                return Err(bad(at("encapsulation_port"), "only fou and gue send to a UDP port"));
            }
            (Encapsulation::Fou | Encapsulation::Gue, None | Some(0)) => {
                return Err(bad(at("encapsulation_port"), "fou and gue need the backends' UDP port"));
            }
            _ => {}
        }
        if t.ttl == 0 {
            return Err(bad(at("ttl"), "0 would be dropped at the first hop"));
        }
        if t.backends.is_empty() {
            return Err(bad(at("backends"), "none"));
        }
        let mut seen = HashSet::new();
        for (j, b) in t.backends.iter().enumerate() {
            let at = |f: &str| format!("tunnel[{i}].backends[{j}].{f}");
            if b.address.is_ipv6() != v6 {
                return Err(bad(
                    at("address"),
                    format!("{} is not of the address's family ({})", b.address, t.address),
                ));
            }
            if !seen.insert(b.address) {
                return Err(bad(at("address"), format!("{} twice", b.address)));
            }
            if !(1..=MAX_WEIGHT).contains(&b.weight) {
                return Err(bad(at("weight"), format!("{} is outside 1..={MAX_WEIGHT}", b.weight)));
            }
        }
        backends += t.backends.len();
        if backends > MAX_BACKENDS as usize {
            return Err(bad(at("backends"), format!("the tunnels name more than {MAX_BACKENDS} backends together")));
        }
        let h = &t.health;
        if h.interval < Duration::from_millis(100) || h.timeout < Duration::from_millis(10) {
            return Err(bad(at("health"), "interval at least 100ms, timeout at least 10ms"));
        }
        if h.timeout > h.interval {
            return Err(bad(at("health.timeout"), "longer than the interval"));
        }
        if !(1..=100).contains(&h.rise) || !(1..=100).contains(&h.fall) {
            return Err(bad(at("health"), "rise and fall are 1-100"));
        }
    }
    Ok(())
}

/// Check the tunnels against the classes: a TCP tunnel's port may not
/// take SYN cookies (the edge would answer the SYNs meant for the
/// backends with its own SYN-ACKs, and the connections would never reach
/// them).
pub fn check_classes(tunnels: &[Tunnel], classes: &[crate::policy::Class]) -> Result<(), PolicyError> {
    for (i, t) in tunnels.iter().enumerate() {
        if t.protocol != Transport::Tcp {
            continue;
        }
        let Ok((a, b)) = t.ports.range() else { continue };
        let cookies = classes.iter().enumerate().filter(|(_, c)| c.syn_cookies != crate::policy::SynCookies::Off);
        for (j, c) in cookies {
            if let Some((lo, _)) = c.ports.iter().find(|(lo, hi)| *lo <= b && a <= *hi) {
                let port = (*lo).max(a);
                return Err(bad(
                    format!("tunnel[{i}].ports"),
                    format!(
                        "port {port} takes SYN cookies in class[{j}] (\"{}\"): this host would answer the SYNs meant \
                         for the backends; set that class's syn_cookies = \"off\" or leave the port out of it",
                        c.name
                    ),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn web() -> Tunnel {
        toml::from_str(
            r#"
            name = "web"
            address = "198.18.0.2"
            protocol = "tcp"
            ports = "80"
            source = "198.18.1.1"
            backends = [{ address = "198.18.2.2" }, { address = "198.18.2.3", weight = 2 }]
            "#,
        )
        .expect("parses")
    }

    #[test]
    fn a_plain_tunnel_passes_with_its_defaults() {
        let t = web();
        check(std::slice::from_ref(&t)).expect("valid");
        assert_eq!(t.encapsulation, Encapsulation::Ipip);
        assert_eq!((t.health.rise, t.health.fall, t.health_port()), (2, 2, 80));
    }

    #[test]
    fn each_mistake_names_its_field() {
        type Break = fn(&mut Tunnel);
        let cases: [(Break, &str); 7] = [
            (|t| t.source = "2001:2::1".parse().expect("addr"), "tunnel[0].source"),
            (|t| t.backends[1].address = "2001:2::3".parse().expect("addr"), "tunnel[0].backends[1].address"),
            (|t| t.backends[0].weight = 0, "tunnel[0].backends[0].weight"),
            (|t| t.encapsulation = Encapsulation::Fou, "tunnel[0].encapsulation_port"),
            (|t| t.ports = Ports::Text("90-80".into()), "tunnel[0].ports"),
            (|t| t.backends.clear(), "tunnel[0].backends"),
            (|t| t.name = "a b".into(), "tunnel[0].name"),
        ];
        for (break_it, field) in cases {
            let mut t = web();
            break_it(&mut t);
            let e = check(&[t]).expect_err(field).to_string();
            assert!(e.contains(field), "{e} names {field}");
        }
        let e = check(&[web(), web()]).expect_err("twice").to_string();
        assert!(e.contains("tunnel[1].name"), "{e}");
    }

    #[test]
    fn a_tunnelled_port_may_not_take_syn_cookies() {
        let text = |cookies: &str| {
            format!(
                "[[class]]\nname = \"syn\"\nprotocol = \"tcp\"\nports = [\"70-90\"]\nsyn = true\nrate = 20\nburst = \
                 40\nsyn_cookies = \"{cookies}\"\n\n[[tunnel]]\nname = \"web\"\naddress = \"198.18.0.2\"\nprotocol = \
                 \"tcp\"\nports = \"80\"\nsource = \"198.18.1.1\"\nbackends = [{{ address = \"198.18.2.2\" }}]\n"
            )
        };
        let p = crate::policy::file::parse("p.toml", text("always")).expect("parses").policy;
        let e = p.compile(1).expect_err("refused").to_string();
        assert!(e.contains("tunnel[0].ports") && e.contains("port 80"), "{e}");
        let p = crate::policy::file::parse("p.toml", text("off")).expect("parses").policy;
        p.compile(1).expect("no cookies, no conflict");
    }
}
