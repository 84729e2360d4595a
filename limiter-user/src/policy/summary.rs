//! The one line that names a policy in logs and `limiter status`.

use std::fmt;

use super::{Policy, SynCookies, spelling};

/// [`Policy::summary`]: `policy vN: rate R packets/s burst B per ...`.
pub struct Summary<'a> {
    pub(super) policy: &'a Policy,
    pub(super) version: u64,
}

impl Summary<'_> {
    /// The line without its `policy vN: ` head.
    #[must_use]
    pub fn body(&self) -> String {
        let s = self.to_string();
        s.split_once(": ").map_or(s.clone(), |(_, b)| b.to_owned())
    }
}

impl fmt::Display for Summary<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = self.policy;
        let d = p.default;
        write!(
            f,
            "policy v{}: rate {} {}/s burst {} per IPv4 /{} and IPv6 /{} ({})",
            self.version, d.rate, d.cost, d.burst, p.v4_prefix, p.v6_prefix, d.mode
        )?;
        for c in &p.classes {
            let l = c.limit;
            match l.window {
                Some(win) => write!(
                    f,
                    "; class {}: {} per {} s in {} slices, {} ({})",
                    c.name,
                    win.limit,
                    win.length.as_secs_f64(),
                    win.slices,
                    spelling(&win.scope),
                    l.mode
                )?,
                None => write!(f, "; class {}: rate {} burst {} ({})", c.name, l.rate, l.burst, l.mode)?,
            }
            if c.syn_cookies != SynCookies::Off {
                write!(f, ", syn cookies {}", spelling(&c.syn_cookies))?;
            }
        }
        if let Some((rate, burst)) = p.new_sources {
            write!(f, "; new sources {rate}/s burst {burst}")?;
        }
        if let Some(a) = p.aggregate {
            write!(f, "; aggregate /{} and /{}: rate {} burst {}", a.v4_prefix, a.v6_prefix, a.rate, a.burst)?;
        }
        if !p.overrides.is_empty() {
            write!(f, "; {} overrides", p.overrides.len())?;
        }
        if !p.tunnels.is_empty() {
            write!(f, "; {} tunnels", p.tunnels.len())?;
        }
        if !p.forwards.is_empty() {
            write!(f, "; {} forwarders", p.forwards.len())?;
        }
        Ok(())
    }
}
