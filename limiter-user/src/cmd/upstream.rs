//! `limiter upstream list|announce|blackhole|withdraw`.

use crate::{
    cli::UpstreamCommand,
    control::{Request, client::Client},
    upstream::UpstreamInfo,
};

pub fn upstream(cmd: &UpstreamCommand, client: Client, json: bool) -> anyhow::Result<()> {
    let req = match cmd {
        UpstreamCommand::List => Request::UpstreamList,
        UpstreamCommand::Announce { cidr, destination, protocol, rate_limit, ttl } => Request::UpstreamAnnounce {
            cidr: *cidr,
            blackhole: false,
            destination: *destination,
            protocol: *protocol,
            rate_limit: *rate_limit,
            ttl_secs: *ttl,
        },
        UpstreamCommand::Blackhole { cidr, ttl } => Request::UpstreamAnnounce {
            cidr: *cidr,
            blackhole: true,
            destination: None,
            protocol: None,
            rate_limit: None,
            ttl_secs: *ttl,
        },
        UpstreamCommand::Withdraw { cidr, .. } => Request::UpstreamWithdraw { cidr: *cidr },
    };
    let info = client.upstream(&req)?;
    if json {
        return super::print_json(&info);
    }
    print(&info);
    Ok(())
}

/// The speaker, its sessions, then one line a rule.
fn print(i: &UpstreamInfo) {
    let s = &i.status;
    println!(
        "speaker {}: {}{}",
        i.speaker,
        if s.speaker_up { "up" } else { "DOWN" },
        if i.shadow { " (shadow: rules are logged, nothing is sent)" } else { "" }
    );
    for (n, up) in &s.neighbours {
        println!("  session {n}: {}", if *up { "established" } else { "DOWN" });
    }
    if let Some(e) = &s.last_error {
        println!("  last error: {}", crate::escape_control(e));
    }
    println!(
        "{} rule(s) of {} at most; the speaker holds {}, {} pending; {} announced, {} withdrawn since start",
        i.rules.len(),
        i.max_rules,
        s.announced,
        s.pending,
        s.announcements,
        s.withdrawals
    );
    if i.pressure.threshold_bits_per_sec > 0 {
        println!(
            "link: {} bits/s received, threshold {}{}",
            i.pressure.rx_bits_per_sec,
            i.pressure.threshold_bits_per_sec,
            if i.pressure.pressured { " (pressure: the top dropping prefixes are announced)" } else { "" }
        );
    }
    let now = crate::clock::unix_now();
    for r in &i.rules {
        println!("{}, {} left", r.describe(), super::human::duration(r.expires.saturating_sub(now)));
    }
}
