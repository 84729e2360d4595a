//! `kind = "ipset"`: the networks of the sets an `ipset save` wrote, for
//! hosts moving an iptables allow or deny list to the guard as it is
//! (`ipset save office > /etc/limiter/office.ipset`, from a timer).
//!
//! A `create` line names a set of networks (`hash:net`) or of addresses
//! (`hash:ip`); an `add` line adds one of its members (a CIDR, or an
//! address: its /32 or /128), whatever its options (`timeout`, counters,
//! `comment "..."`). Refused, with the line: a set of another type (a
//! `hash:ip,port` member is not a network), a member of a set not
//! created above, and a `nomatch` member (an exception carved out of a
//! wider one, which a list of networks cannot hold).

use std::collections::BTreeSet;

use ipnet::IpNet;

use super::{Kind, MAX_NETWORKS, Refused};
use crate::policy::words::Action;

pub const KIND: Kind = Kind { name: "ipset", actions: &[Action::Allow, Action::Deny], read };

/// The set types whose members are networks or addresses.
const TYPES: [&str; 2] = ["hash:net", "hash:ip"];

fn read(text: &str) -> Result<BTreeSet<IpNet>, Refused> {
    let mut sets: Vec<String> = Vec::new();
    super::per_line(text, MAX_NETWORKS, |line| {
        let mut words = line.split_whitespace();
        match (words.next(), words.next(), words.next()) {
            (Some("create"), Some(name), Some(kind)) => {
                if !TYPES.contains(&kind) {
                    return Err(format!("set {name} is {kind}, not a set of networks ({})", TYPES.join(" or ")));
                }
                sets.push(name.to_owned());
                Ok(None)
            }
            (Some("add"), Some(name), Some(entry)) => {
                if !sets.iter().any(|s| s == name) {
                    return Err(format!("a member of set {name}, which no `create` line above names"));
                }
                // Options come before the comment, which comes last.
                if words.take_while(|w| *w != "comment").any(|w| w == "nomatch") {
                    return Err(format!("{entry} is a nomatch exception, which a list of networks cannot hold"));
                }
                member(entry).map(Some)
            }
            _ => Err(format!("{line:?} is not a `create` or `add` line of `ipset save`")),
        }
    })
}

/// A member: a CIDR or an address.
fn member(text: &str) -> Result<IpNet, String> {
    text.parse::<IpNet>()
        .map(|n| n.trunc())
        .or_else(|_| text.parse::<std::net::IpAddr>().map(IpNet::from))
        .map_err(|_| format!("{text:?} is not an address or a CIDR"))
}

#[cfg(test)]
mod tests;
