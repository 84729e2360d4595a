//! `cargo xtask demo`: two namespaces joined by a veth pair, the real
//! `limiter run` attached on the receiving side, one /24 flooding and one
//! sending within its allowance; prints what each prefix got.

use limiter_tests::{
    kernel::require_root,
    scenario::{self, CONFORM_SRC, FLOOD_SRC, Flood},
};

fn main() -> anyhow::Result<()> {
    require_root();
    let f = Flood { rate: 1000, burst: 200, secs: 5.0, flood_pps: 0, conform_pps: 500, mode: "native" };
    let limiter = scenario::locate_bin("limiter")?;
    let netload = scenario::locate_bin("netload")?;
    println!(
        "demo: limiter at {} packets/s, burst {}, per /24; {FLOOD_SRC} floods flat out for {} s, {CONFORM_SRC} sends {} packets/s",
        f.rate, f.burst, f.secs, f.conform_pps
    );
    let o = scenario::run(&limiter, &netload, &f)?;
    println!("\n--- limiter's own output ---\n{}", o.daemon_log.trim_end());
    #[expect(clippy::cast_precision_loss, reason = "display only")]
    let allowance = f.burst as f64 + f.rate as f64 * o.flood_secs;
    println!("\n{:<16} {:<11} {:>10} {:>10} {:>10} {:>12}", "prefix", "role", "sent", "passed", "dropped", "allowance");
    println!(
        "{:<16} {:<11} {:>10} {:>10} {:>10} {:>12.0}",
        "198.18.1.0/24",
        "flood",
        o.flood_sent,
        o.flood_received,
        o.flood_sent - o.flood_received,
        allowance
    );
    println!(
        "{:<16} {:<11} {:>10} {:>10} {:>10} {:>12}",
        "198.18.2.0/24",
        "conforming",
        o.conform_sent,
        o.conform_received,
        o.conform_sent - o.conform_received,
        "-"
    );
    println!("\nXDP counters: passed {} dropped {} (all prefixes, ARP included)", o.xdp_passed, o.xdp_dropped);
    Ok(())
}
