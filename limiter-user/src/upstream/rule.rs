//! A rule announced upstream, and its text in ExaBGP's command language.

use std::fmt::Write as _;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::origin::Origin;

/// What kind of route a rule is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A FlowSpec rule matching a source network (RFC 8955/8956).
    Flowspec,
    /// A route to a destination with the BLACKHOLE community (RFC 7999):
    /// the transit drops everything sent to it.
    Blackhole,
}

/// What the transit is asked to do with what a FlowSpec rule matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "action")]
pub enum Action {
    Discard,
    /// At most this many bytes a second (RFC 8955's traffic-rate).
    RateLimit {
        bytes_per_sec: u64,
    },
}

/// The word for a rule's author on the wire, in the speaker's saved
/// state and in the metrics' `by` label: the operator is `operator` there
/// (as it has always been), automation its label (`escalation`,
/// `pressure`). A higher author's rule is never replaced by a lower's.
#[must_use]
pub fn by_word(by: Origin) -> &'static str {
    if by == Origin::Operator { "operator" } else { by.label() }
}

/// A rule's `by`, as [`by_word`] writes it.
mod by_wire {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    use super::{Origin, by_word};

    #[expect(clippy::trivially_copy_pass_by_ref, reason = "serde's serialize_with signature")]
    pub(super) fn serialize<S: Serializer>(by: &Origin, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(by_word(*by))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Origin, D::Error> {
        let word = String::deserialize(d)?;
        [Origin::Operator, Origin::Escalation, Origin::Pressure]
            .into_iter()
            .find(|o| by_word(*o) == word)
            .ok_or_else(|| D::Error::custom(format!("unknown author of a rule {word:?}")))
    }
}

/// What identifies a route: one rule per key.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Key {
    pub kind: Kind,
    /// A FlowSpec rule's source, a blackhole's destination.
    pub net: IpNet,
    /// A FlowSpec rule's destination, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dest: Option<IpNet>,
    /// A FlowSpec rule's IP protocol, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<u8>,
    /// A FlowSpec rule's source port ranges (inclusive; none: any port).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub source_ports: Vec<(u16, u16)>,
    /// A FlowSpec rule's destination port ranges (none: any port).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<(u16, u16)>,
}

/// A rule the daemon wants announced.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    #[serde(flatten)]
    pub key: Key,
    #[serde(flatten)]
    pub action: Action,
    #[serde(with = "by_wire")]
    pub by: Origin,
    /// Unix time it was asked for.
    pub since: u64,
    /// Unix time it is withdrawn (a pressure rule's is pushed on while
    /// the pressure lasts).
    pub expires: u64,
}

impl Key {
    /// A FlowSpec rule on a source network.
    #[must_use]
    pub fn flow(net: IpNet) -> Self {
        Key {
            kind: Kind::Flowspec,
            net: net.trunc(),
            dest: None,
            protocol: None,
            source_ports: Vec::new(),
            ports: Vec::new(),
        }
    }

    /// A blackhole route to a destination.
    #[must_use]
    pub fn blackhole(net: IpNet) -> Self {
        Key {
            kind: Kind::Blackhole,
            net: net.trunc(),
            dest: None,
            protocol: None,
            source_ports: Vec::new(),
            ports: Vec::new(),
        }
    }

    /// Its match, as ExaBGP reads it (`{ source ...; }`) or its prefix.
    fn nlri(&self) -> String {
        match self.kind {
            Kind::Blackhole => self.net.to_string(),
            Kind::Flowspec => {
                let mut m = format!("match {{ source {};", self.net);
                if let Some(d) = self.dest {
                    let _ = write!(m, " destination {d};");
                }
                if let Some(p) = self.protocol {
                    // ExaBGP takes `protocol` for IPv4 and `next-header`
                    // for IPv6 (RFC 8956).
                    let word = if self.net.addr().is_ipv4() { "protocol" } else { "next-header" };
                    let _ = write!(m, " {word} ={};", protocol_name(p));
                }
                for (word, ranges) in [("source-port", &self.source_ports), ("destination-port", &self.ports)] {
                    if !ranges.is_empty() {
                        let _ = write!(m, " {word} [ {} ];", port_terms(ranges));
                    }
                }
                m.push_str(" }");
                m
            }
        }
    }
}

/// Port ranges as FlowSpec's numeric terms (`=53`, `>=1000&<=2000`).
fn port_terms(ranges: &[(u16, u16)]) -> String {
    let term = |&(a, b): &(u16, u16)| if a == b { format!("={a}") } else { format!(">={a}&<={b}") };
    ranges.iter().map(term).collect::<Vec<_>>().join(" ")
}

/// Port ranges as `limiter upstream list` writes them (`53`, `1000-2000`).
fn port_list(ranges: &[(u16, u16)]) -> String {
    let term = |&(a, b): &(u16, u16)| if a == b { a.to_string() } else { format!("{a}-{b}") };
    ranges.iter().map(term).collect::<Vec<_>>().join(",")
}

/// The IP protocols ExaBGP names (it takes a number for the others).
const PROTOCOLS: [(&str, u8); 4] = [("icmp", 1), ("tcp", 6), ("udp", 17), ("icmp6", 58)];

/// ExaBGP's name of an IP protocol, or its number.
fn protocol_name(p: u8) -> String {
    PROTOCOLS.iter().find(|(_, n)| *n == p).map_or_else(|| p.to_string(), |(name, _)| (*name).to_owned())
}

/// An IP protocol by name or number (`tcp`, `udp`, `icmp`, `17`).
#[must_use]
pub fn protocol(s: &str) -> Option<u8> {
    PROTOCOLS.iter().find(|(name, _)| *name == s).map(|(_, n)| *n).or_else(|| s.parse().ok())
}

/// The BLACKHOLE community (RFC 7999).
pub const BLACKHOLE: &str = "65535:666";

impl Rule {
    /// The command that announces it, with `communities` added.
    #[must_use]
    pub fn announce(&self, communities: &[String]) -> String {
        format!("announce {}", self.route(communities))
    }

    /// The command that withdraws it.
    #[must_use]
    pub fn withdraw(&self, communities: &[String]) -> String {
        format!("withdraw {}", self.route(communities))
    }

    fn route(&self, communities: &[String]) -> String {
        match self.key.kind {
            Kind::Flowspec => {
                let action = match self.action {
                    Action::Discard => "discard;".to_owned(),
                    Action::RateLimit { bytes_per_sec } => format!("rate-limit {bytes_per_sec};"),
                };
                let c = if communities.is_empty() {
                    String::new()
                } else {
                    format!(" community [{}];", communities.join(" "))
                };
                format!("flow route {{ {} then {{ {action}{c} }} }}", self.key.nlri())
            }
            Kind::Blackhole => {
                let mut all = vec![BLACKHOLE.to_owned()];
                all.extend(communities.iter().cloned());
                format!("route {} next-hop self community [{}]", self.key.nlri(), all.join(" "))
            }
        }
    }

    /// One line for logs and `limiter upstream list`: the route, its
    /// action and who asked for it.
    #[must_use]
    pub fn describe(&self) -> String {
        let what = match (self.key.kind, self.action) {
            (Kind::Blackhole, _) => format!("blackhole {}", self.key.net),
            (Kind::Flowspec, a) => {
                let mut s = format!("flowspec source {}", self.key.net);
                if let Some(d) = self.key.dest {
                    let _ = write!(s, " destination {d}");
                }
                if let Some(p) = self.key.protocol {
                    let _ = write!(s, " protocol {}", protocol_name(p));
                }
                if !self.key.source_ports.is_empty() {
                    let _ = write!(s, " source-port {}", port_list(&self.key.source_ports));
                }
                if !self.key.ports.is_empty() {
                    let _ = write!(s, " port {}", port_list(&self.key.ports));
                }
                match a {
                    Action::Discard => s.push_str(" discard"),
                    Action::RateLimit { bytes_per_sec } => {
                        let _ = write!(s, " rate-limit {bytes_per_sec} B/s");
                    }
                }
                s
            }
        };
        format!("{what} by {}", by_word(self.by))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(key: Key, action: Action) -> Rule {
        Rule { key, action, by: Origin::Operator, since: 1, expires: 2 }
    }

    /// The commands are ExaBGP's own syntax (the daemon tier's BIRD sees
    /// what they announce); the network is its own prefix, never an
    /// address with host bits.
    #[test]
    fn commands_name_the_match_and_the_action() {
        let r = rule(Key::flow("198.18.80.7/24".parse().unwrap()), Action::Discard);
        assert_eq!(r.announce(&[]), "announce flow route { match { source 198.18.80.0/24; } then { discard; } }");
        let mut k = Key::flow("2001:2:80::/48".parse().unwrap());
        k.dest = Some("2001:2:90::1/128".parse().unwrap());
        k.protocol = protocol("udp");
        let r = rule(k, Action::RateLimit { bytes_per_sec: 1500 });
        assert_eq!(
            r.withdraw(&["64500:1".into()]),
            "withdraw flow route { match { source 2001:2:80::/48; destination 2001:2:90::1/128; next-header =udp; } \
             then { rate-limit 1500; community [64500:1]; } }"
        );
        // A class's ports, as FlowSpec's numeric terms.
        let mut k = Key::flow("198.18.22.0/24".parse().unwrap());
        k.protocol = protocol("udp");
        k.source_ports = vec![(53, 53)];
        k.ports = vec![(1000, 2000), (443, 443)];
        let r = rule(k, Action::RateLimit { bytes_per_sec: 9 });
        assert_eq!(
            r.announce(&[]),
            "announce flow route { match { source 198.18.22.0/24; protocol =udp; source-port [ =53 ]; \
             destination-port [ >=1000&<=2000 =443 ]; } then { rate-limit 9; } }"
        );
        assert_eq!(
            r.describe(),
            "flowspec source 198.18.22.0/24 protocol udp source-port 53 port 1000-2000,443 rate-limit 9 B/s by operator"
        );
        let b = rule(Key::blackhole("198.18.90.1/32".parse().unwrap()), Action::Discard);
        assert_eq!(b.announce(&[]), "announce route 198.18.90.1/32 next-hop self community [65535:666]");
    }

    /// A rule survives the state file as written.
    #[test]
    fn a_rule_round_trips_through_json() {
        let r = rule(Key::flow("198.18.80.0/24".parse().unwrap()), Action::RateLimit { bytes_per_sec: 9 });
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<Rule>(&text).unwrap(), r);
        // Its author in the words earlier builds wrote and read.
        for (by, word) in
            [(Origin::Operator, "operator"), (Origin::Escalation, "escalation"), (Origin::Pressure, "pressure")]
        {
            let text = serde_json::to_string(&Rule { by, ..r.clone() }).unwrap();
            assert!(text.contains(&format!("\"by\":\"{word}\"")), "{text}");
            assert_eq!(serde_json::from_str::<Rule>(&text).unwrap().by, by);
        }
        let runtime = text.replace("\"by\":\"operator\"", "\"by\":\"runtime\"");
        assert!(serde_json::from_str::<Rule>(&runtime).is_err(), "{runtime}");
    }
}
