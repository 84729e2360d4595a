//! `limiter backend list|drain|undrain`.

use std::fmt::Write as _;

use crate::{
    cli::BackendCommand,
    control::{Request, client::Client},
    tunnel::{OUTCOMES, TunnelsInfo},
};

pub fn backend(cmd: &BackendCommand, client: Client, json: bool) -> anyhow::Result<()> {
    let req = match cmd {
        BackendCommand::List => Request::Tunnels,
        BackendCommand::Drain { address } => Request::BackendDrain { address: *address, drain: true },
        BackendCommand::Undrain { address } => Request::BackendDrain { address: *address, drain: false },
    };
    let info = client.tunnels(&req)?;
    if json {
        return super::print_json(&info);
    }
    print!("{}", render(&info));
    Ok(())
}

/// One line a tunnel, then one a backend; the packets not forwarded.
fn render(info: &TunnelsInfo) -> String {
    let mut out = String::new();
    if info.tunnels.is_empty() {
        out.push_str("no tunnels in the policy\n");
    }
    for t in &info.tunnels {
        let proto = format!("{:?}", t.protocol).to_lowercase();
        let ports = if t.ports.0 == t.ports.1 { t.ports.0.to_string() } else { format!("{}-{}", t.ports.0, t.ports.1) };
        let _ = writeln!(out, "tunnel {} {} {proto} {ports}", t.name, t.address);
        for b in &t.backends {
            let why = b.error.as_ref().map(|e| format!("  ({})", crate::escape_control(e))).unwrap_or_default();
            let _ = writeln!(
                out,
                "  {:<40} {:<8} weight {:<3} {:>12} packets {:>14} bytes{why}",
                b.address.to_string(),
                b.state,
                b.weight,
                b.packets,
                b.bytes
            );
        }
    }
    let not: Vec<String> =
        OUTCOMES.iter().zip(&info.outcomes).filter(|(_, n)| **n > 0).map(|(o, n)| format!("{o} {n}")).collect();
    if !not.is_empty() {
        let _ = writeln!(out, "not forwarded: {}", not.join(", "));
    }
    out
}
