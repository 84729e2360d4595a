//! `kind = "plain"`: one network per line, as an operator writes an allow
//! list by hand: a CIDR (`198.18.0.0/24`, `2001:2::/48`) or a bare
//! address (its /32 or /128); `#` starts a comment. A CIDR with host bits
//! set is refused (a typo for its network, or for another length).

use std::collections::BTreeSet;

use ipnet::IpNet;

use super::{Kind, MAX_NETWORKS, Refused, per_line};
use crate::policy::words::Action;

pub const KIND: Kind = Kind { name: "plain", actions: &[Action::Allow, Action::Deny], read };

fn read(text: &str) -> Result<BTreeSet<IpNet>, Refused> {
    per_line(text, MAX_NETWORKS, |line| network(line).map(Some))
}

/// One line's network.
fn network(line: &str) -> Result<IpNet, String> {
    let net = match line.parse::<IpNet>() {
        Ok(net) => net,
        Err(_) => line.parse::<std::net::IpAddr>().map(IpNet::from).map_err(|_| format!("{line:?} is not an address or a CIDR"))?,
    };
    if net.trunc() != net {
        return Err(format!("{net} has host bits set (the network is {})", net.trunc()));
    }
    Ok(crate::nets::unmapped(net))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_and_bare_addresses_are_read_and_host_bits_refused() {
        let nets = read("# monitoring\n198.18.7.9\n198.18.0.0/24 # office\n2001:2::1\n::ffff:198.18.9.0/120\n").unwrap();
        let want: BTreeSet<IpNet> = ["198.18.7.9/32", "198.18.0.0/24", "2001:2::1/128", "198.18.9.0/24"]
            .iter()
            .map(|n| n.parse().unwrap())
            .collect();
        assert_eq!(nets, want);
        let e = read("198.18.0.0/24\n198.18.7.5/24\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.why.contains("host bits") && e.why.contains("198.18.7.0/24"), "{e}");
        assert!(read("allow 198.18.0.0/24;\n").unwrap_err().why.contains("not an address"));
    }
}
