//! `limiter prefix list|set|allow|deny|unset`.

use crate::{
    cli::PrefixCommand,
    control::{Request, client::Client},
};

pub fn prefix(cmd: &PrefixCommand, client: Client, json: bool) -> anyhow::Result<()> {
    let req = match cmd {
        PrefixCommand::List => return list(client, json),
        PrefixCommand::Set { cidr, rate, burst } => {
            Request::PrefixSet { cidr: cidr.clone(), rate: *rate, burst: *burst }
        }
        PrefixCommand::Allow { cidr } => Request::PrefixAllow { cidr: cidr.clone() },
        PrefixCommand::Deny { cidr } => Request::PrefixDeny { cidr: cidr.clone() },
        PrefixCommand::Unset { cidr } => Request::PrefixUnset { cidr: cidr.clone() },
    };
    super::policy::print_applied(&client.change(&req)?, json)
}

fn list(client: Client, json: bool) -> anyhow::Result<()> {
    let l = client.prefix_list()?;
    if json {
        return super::print_json(&serde_json::json!({ "version": l.version, "overrides": l.entries }));
    }
    println!("{:<44} {:<7} {:>12} {:>12} {:<8}", "prefix", "action", "rate", "burst", "origin");
    for e in &l.entries {
        let num = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |n| n.to_string());
        println!("{:<44} {:<7} {:>12} {:>12} {:<8}", e.cidr, e.action, num(e.rate), num(e.burst), e.origin);
    }
    Ok(())
}
