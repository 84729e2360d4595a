//! `bench system`'s receivers beyond an XDP program of the bench's own:
//! the netfilter peers' rules, xdp-filter, and each one's drop counter.

use std::process::Command;

use limiter::dataplane::DataPlane;
use limiter_common::Reason;
use limiter_tests::netns::{B_IF, NetNs};

use super::{BURST, ENTRIES, Filter, RATE};

pub(crate) fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("spawn");
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr).trim());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Load nftables `rules` (a whole ruleset file) in `ns`.
pub(crate) fn nft_load(ns: &NetNs, rules: &str) {
    let mut child = ns
        .command("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("nft (cargo xtask setup installs nftables)");
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), rules.as_bytes()).unwrap();
    assert!(child.wait().unwrap().success(), "nft rules refused:\n{rules}");
}

/// Packets counted by the first `counter` of nftables table `table`
/// (`FAMILY NAME`) in `ns`.
pub(crate) fn nft_counter(ns: &NetNs, table: &str) -> u64 {
    let out = run(ns.command("nft").arg("list").arg("table").args(table.split_whitespace()));
    let after = out.split("counter packets ").nth(1).expect("nft counter");
    after.split_whitespace().next().unwrap().parse().unwrap()
}

pub(super) fn nft_rules() -> String {
    format!(
        "table netdev bench {{
  chain ingress {{
    type filter hook ingress device \"{B_IF}\" priority 0; policy accept;
    meta protocol ip meter per24 size {ENTRIES} {{ ip saddr and 255.255.255.0 limit rate over {RATE}/second burst {BURST} packets }} counter drop
  }}
}}
"
    )
}

pub(super) fn iptables_rules(bin: &str, ns: &NetNs) {
    run(ns.command(bin).args(["-t", "raw", "-A", "PREROUTING", "-m", "hashlimit", "--hashlimit-name", "per24"]).args(
        [
            "--hashlimit-mode",
            "srcip",
            "--hashlimit-srcmask",
            "24",
            "--hashlimit-upto",
            &format!("{RATE}/second"),
            "--hashlimit-burst",
            &BURST.to_string(),
            "--hashlimit-htable-size",
            &ENTRIES.to_string(),
            "--hashlimit-htable-max",
            &ENTRIES.to_string(),
            "-j",
            "ACCEPT",
        ],
    ));
    run(ns.command(bin).args(["-t", "raw", "-A", "PREROUTING", "-j", "DROP"]));
}

/// Sum of the veth's `ethtool -S` counters whose name ends with `suffix`
/// (one per queue).
pub(crate) fn veth_stat(ns: &NetNs, iface: &str, suffix: &str) -> u64 {
    let out = run(ns.command("ethtool").args(["-S", iface]));
    out.lines()
        .filter_map(|l| l.trim().split_once(": "))
        .filter(|(k, _)| k.ends_with(suffix))
        .map(|(_, v)| v.trim().parse::<u64>().unwrap_or(0))
        .sum()
}

/// Packets the filter dropped, read from its own counters.
pub(super) fn dropped(filter: Filter, ns: &NetNs, xdp: &DataPlane) -> u64 {
    match filter {
        Filter::Drop | Filter::TouchDrop | Filter::XdpFilt => veth_stat(ns, B_IF, "_xdp_drops"),
        Filter::Limiter => xdp.maps.totals().expect("read STATS").get(Reason::RateLimited).packets,
        Filter::LimiterDeny => xdp.maps.totals().expect("read STATS").get(Reason::Denied).packets,
        Filter::Nft => nft_counter(ns, "netdev bench"),
        Filter::Iptables | Filter::IptablesLegacy => {
            let bin = if filter == Filter::Iptables { "iptables" } else { "iptables-legacy" };
            let out = run(ns.command(bin).args(["-t", "raw", "-L", "PREROUTING", "-n", "-v", "-x"]));
            let l = out.lines().find(|l| l.split_whitespace().nth(2) == Some("DROP")).expect("DROP rule");
            l.split_whitespace().next().unwrap().parse().unwrap()
        }
    }
}

/// xdp-filter on the receiving veth (native mode, through libxdp), the
/// flood's source denied; unloaded with the namespaces.
pub(super) fn xdp_filter_on_vb(ns: &NetNs) {
    for args in [&["load", "-m", "native", "-f", "ipv4", B_IF][..], &["ip", "-m", "src", "198.18.1.10"]] {
        let o = ns.net_command("xdp-filter").args(args).output().expect("xdp-filter (cargo xtask setup --bench)");
        assert!(o.status.success(), "xdp-filter {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    }
}
