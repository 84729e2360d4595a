//! `limiter explain ADDR`: the verdict first, then each layer the data
//! plane asks, in its order, the one that decides marked.

use super::table::{Align::Left, Table};
use crate::control::client::Client;

pub fn explain(
    client: Client,
    addr: std::net::IpAddr,
    protocol: crate::policy::Protocol,
    port: Option<u16>,
    syn: bool,
    json: bool,
) -> anyhow::Result<()> {
    let e = client.explain(addr, protocol, port, syn)?;
    if json {
        return super::print_json(&e);
    }
    let packet = match (e.protocol, e.port) {
        (crate::policy::Protocol::Any, _) => String::new(),
        (p, Some(port)) => format!(" ({p}{} to port {port})", if e.syn { " SYN" } else { "" }),
        (p, None) => format!(" ({p}{})", if e.syn { " SYN" } else { "" }),
    };
    println!(
        "{}{packet}: {} ({}), decided by {}; bucket prefix {}, policy v{}",
        e.address,
        super::paint::verdict(&e.verdict),
        e.reason,
        e.decided_by,
        e.cidr,
        e.version
    );
    let mut t = Table::new(&[("", Left), ("layer", Left), ("state", Left)]);
    for l in &e.layers {
        let mark = if l.decides { "->" } else { "" };
        t.row(vec![mark.to_owned(), l.layer.clone(), l.says.clone()]);
    }
    print!("{}", t.render());
    Ok(())
}
