//! SYN cookies of a policy's classes, compiled into `Config::cookies`:
//! each class's mode and `auto` threshold, and the port ranges the
//! program tells a cookie class's ACKs by.

use limiter_common::{Config, flags, gcra};

use super::{Mode, PolicyError, bad};

/// MSS a SYN cookie's SYN-ACK advertises over IPv4 and IPv6: an
/// Ethernet MTU of 1500 less the IP and TCP headers.
pub const COOKIE_MSS: (u16, u16) = (1460, 1440);

/// SYN cookies of each class: only for classes of new TCP connections to
/// named ports (an ACK is checked against the class its SYN would be in,
/// so a class that matched any port would check the replies to this
/// host's own outgoing connections), and only where a SYN may be refused
/// at all (not in shadow mode).
pub(super) fn compile(classes: &[super::Class], new_rate: Option<u64>, config: &mut Config) -> Result<(), PolicyError> {
    use super::SynCookies;
    use limiter_common::cookie::{PERIOD, mode};
    config.cookies.mss4 = COOKIE_MSS.0;
    config.cookies.mss6 = COOKIE_MSS.1;
    for (i, c) in classes.iter().enumerate() {
        let at = format!("class[{i}].");
        if c.syn_rate.is_some() && c.syn_cookies != SynCookies::Auto {
            return Err(bad(format!("{at}syn_rate"), "belongs to syn_cookies = \"auto\""));
        }
        if c.syn_cookies == SynCookies::Off {
            continue;
        }
        if c.protocol != super::Protocol::Tcp || !c.syn || c.ports.is_empty() {
            return Err(bad(
                format!("{at}syn_cookies"),
                "needs protocol = \"tcp\", syn = true and the listening ports",
            ));
        }
        if c.limit.mode == Mode::Shadow {
            return Err(bad(format!("{at}syn_cookies"), "a class in shadow mode refuses nothing to answer for"));
        }
        config.cookies.mode[i + 1] = match c.syn_cookies {
            SynCookies::Off => mode::OFF,
            SynCookies::Auto => mode::AUTO,
            SynCookies::Always => mode::ALWAYS,
        };
        if c.syn_cookies == SynCookies::Auto {
            let Some(rate) = c.syn_rate.or(new_rate) else {
                return Err(bad(
                    format!("{at}syn_rate"),
                    "syn_cookies = \"auto\" without a new-source budget needs syn_rate",
                ));
            };
            if !(1..=gcra::MAX_RATE).contains(&rate) {
                return Err(bad(format!("{at}syn_rate"), format!("{rate} is outside 1..={}", gcra::MAX_RATE)));
            }
            // SYNs per counting period: rate x PERIOD (1/16 ns), at least one.
            let per = (u128::from(rate) * u128::from(PERIOD) / u128::from(gcra::to_fixed(gcra::NS_PER_S))).max(1);
            config.cookies.per_period[i + 1] = u32::try_from(per).unwrap_or(u32::MAX);
        }
        config.flags |= flags::SYN_COOKIES;
    }
    cookie_ranges(config)
}

/// The ports whose SYNs land in a class with cookies on (first matcher
/// wins, as in the program), as the ranges the program checks ACKs with.
fn cookie_ranges(config: &mut Config) -> Result<(), PolicyError> {
    use limiter_common::{
        cookie::{MAX_RANGES, mode},
        packet::{IPPROTO_TCP, Source},
        rules::classify,
    };
    let mut ranges: Vec<(u16, u16, usize)> = Vec::new();
    for port in 0..=u16::MAX {
        let src = Source { proto: IPPROTO_TCP, port_known: 1, syn: 1, dport: port, ..Source::default() };
        let class = classify(config, &src);
        if config.cookies.mode[class] == mode::OFF {
            continue;
        }
        match ranges.last_mut() {
            Some((_, hi, c)) if *c == class && u32::from(*hi) + 1 == u32::from(port) => *hi = port,
            _ => ranges.push((port, port, class)),
        }
    }
    if ranges.len() > MAX_RANGES {
        return Err(bad(
            "class",
            format!(
                "the ports of classes with syn_cookies split into {} ranges, at most {MAX_RANGES} fit",
                ranges.len()
            ),
        ));
    }
    for (i, (lo, hi, class)) in ranges.into_iter().enumerate() {
        config.cookies.lo[i] = lo;
        config.cookies.hi[i] = hi;
        config.cookies.class[i] = u8::try_from(class).expect("fewer than MAX_CLASSES");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use limiter_common::flags;

    use crate::policy::{Class, Compiled, Limit, Mode, Policy, PolicyError, SynCookies, tests::https_syn};

    #[test]
    fn syn_cookies_are_for_enforced_classes_of_new_connections_to_named_ports() {
        let with = |f: fn(&mut Class)| {
            let mut c = Class { limit: Limit { mode: Mode::Enforce, ..https_syn().limit }, ..https_syn() };
            c.syn_cookies = SynCookies::Auto;
            f(&mut c);
            Policy { classes: vec![c], ..Policy::default() }.compile(1)
        };
        let field = |r: Result<Compiled, PolicyError>| r.unwrap_err().field;
        assert_eq!(field(with(|c| c.syn = false)), "class[0].syn_cookies");
        assert_eq!(field(with(|c| c.ports.clear())), "class[0].syn_cookies");
        assert_eq!(field(with(|c| c.limit.mode = Mode::Shadow)), "class[0].syn_cookies");
        assert_eq!(field(with(|c| (c.syn_cookies, c.syn_rate) = (SynCookies::Always, Some(5)))), "class[0].syn_rate");
        let p = Policy { new_sources: None, ..Policy::default() };
        let mut c = Class { limit: Limit { mode: Mode::Enforce, ..https_syn().limit }, ..https_syn() };
        c.syn_cookies = SynCookies::Auto;
        let e = Policy { classes: vec![c.clone()], ..p.clone() }.compile(1).unwrap_err();
        assert_eq!(e.field, "class[0].syn_rate", "auto needs a rate when there is no budget: {e}");
        // 2,000 SYNs/s: 500 per 250 ms period; the budget's rate otherwise.
        c.syn_rate = Some(2_000);
        let k = Policy { classes: vec![c.clone()], ..p }.compile(1).unwrap().config;
        assert_eq!((k.cookies.mode[1], k.cookies.per_period[1]), (limiter_common::cookie::mode::AUTO, 500));
        assert_ne!(k.flags & flags::SYN_COOKIES, 0);
        c.syn_rate = None;
        let k = Policy { classes: vec![c], ..Policy::default() }.compile(1).unwrap().config;
        assert_eq!(k.cookies.per_period[1], 5_000 / 4);
    }

    #[test]
    fn cookie_port_ranges_follow_the_first_matching_class() {
        let mut cookies = Class { limit: Limit { mode: Mode::Enforce, ..https_syn().limit }, ..https_syn() };
        cookies.syn_cookies = SynCookies::Always;
        cookies.ports = vec![(8000, 8999)];
        // An earlier class takes the SYNs to 8443: they are not the cookie class's.
        let earlier = Class { name: "alt".into(), ports: vec![(8443, 8443)], ..cookies.clone() };
        let earlier = Class { syn_cookies: SynCookies::Off, ..earlier };
        let k = Policy { classes: vec![earlier, cookies.clone()], ..Policy::default() }.compile(1).unwrap().config;
        let ranges: Vec<(u16, u16, u8)> = (0..limiter_common::cookie::MAX_RANGES)
            .map(|i| (k.cookies.lo[i], k.cookies.hi[i], k.cookies.class[i]))
            .collect();
        assert_eq!(ranges[..3], [(8000, 8442, 2), (8444, 8999, 2), (0, 0, 0)]);
        assert_eq!(k.cookies.class_of(8442), Some(2));
        assert_eq!(k.cookies.class_of(8443), None);
        // Nine separate ranges do not fit.
        cookies.ports = (0..9).map(|i| (1000 + 10 * i, 1000 + 10 * i)).collect();
        let e = Policy { classes: vec![cookies], ..Policy::default() }.compile(1).unwrap_err();
        assert!(e.problem.contains("9 ranges"), "{e}");
    }
}
