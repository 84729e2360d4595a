//! The fleet tests' policy and the 9x run they share.

use super::*;

/// An address as `prefix show` asks it: its host network.
pub(super) fn host(a: &str) -> ipnet::IpNet {
    a.parse::<std::net::IpAddr>().unwrap().into()
}

pub(super) fn policy(store: &[String], limit: u64, sync_ms: u64) -> String {
    let store: Vec<String> = store.iter().map(|s| format!("{s:?}")).collect();
    format!(
        "rate = 100000\nburst = 100000\n\n[[class]]\nname = \"quota\"\nprotocol = \"udp\"\nports = [{PORT}]\nlimit = {limit}\nwindow = \"6s\"\nslices = 12\nscope = \"fleet\"\n\n[fleet]\nstore = [{}]\nnode = \"{{node}}\"\nnodes = 3\nsync_interval = \"{sync_ms}ms\"\n",
        store.join(", ")
    )
}

/// Every node reports the store up and all three nodes seen.
pub(super) fn synced(nodes: &[Node]) -> bool {
    nodes.iter().all(|n| {
        Client::new(&n.socket).fleet_status().ok().flatten().is_some_and(|f| f.store_up && f.nodes_seen.len() == 3)
    })
}

/// The client at 9x its rate through 3 nodes: the busiest window through
/// the whole fleet holds at most 1.1x the limit.
pub(super) fn nine_times(nodes: &[Node]) {
    assert!(eventually(Duration::from_secs(10), || synced(nodes)), "the nodes never all synced");
    let times = schedule(900, 13, SLICE_NS, 300_000_000, 0);
    let got = run(nodes, &[Flow { src: CLIENT, times }], 20_260_730);
    let (sent, admitted) = &got[0];
    let peak = busiest(admitted, WINDOW_NS);
    println!(
        "9x through 3 nodes: sent {sent}, admitted {}, busiest 6 s window {peak} ({:.3}x the limit of 600)",
        admitted.len(),
        peak as f64 / 600.0
    );
    for n in nodes {
        let c = Client::new(&n.socket);
        println!("{:?}\n{:?}", c.fleet_status().unwrap(), c.prefix_show(host(CLIENT)).unwrap());
    }
    assert!(peak >= 600, "the fleet admitted less than the limit in a window: {peak}");
    assert!(peak <= 660, "busiest window {peak} is past 1.1x the limit");
}
