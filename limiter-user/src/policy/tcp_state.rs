//! `tcp_state` of the default class and of each class, compiled into the
//! two bits per class of `Config::flags` (`limiter_common::tcp_state`).
//! Left out, it is `auto` wherever the class takes TCP segments other
//! than SYNs: the default class, and classes of protocol `tcp` or `any`
//! without `syn = true`.

use limiter_common::{Config, tcp_state};

use super::{Class, PolicyError, Protocol, TcpState, bad};

/// Set each class's bits in `config.flags`.
pub(super) fn compile(default: TcpState, classes: &[Class], config: &mut Config) -> Result<(), PolicyError> {
    config.flags |= tcp_state::bits(0, mode(default));
    for (i, c) in classes.iter().enumerate() {
        let takes = matches!(c.protocol, Protocol::Tcp | Protocol::Any) && !c.syn;
        let state = match c.tcp_state {
            None if takes => TcpState::Auto,
            None | Some(TcpState::Off) => TcpState::Off,
            Some(s) if !matches!(c.protocol, Protocol::Tcp | Protocol::Any) => {
                return Err(bad(
                    format!("class[{i}].tcp_state"),
                    format!("\"{s}\" needs protocol = \"tcp\" or \"any\""),
                ));
            }
            Some(s) if c.syn => {
                return Err(bad(
                    format!("class[{i}].tcp_state"),
                    format!(
                        "\"{s}\" judges the segments after a SYN, and a class with syn = true takes SYNs only: set it \
                         on the class its connections' other segments fall in"
                    ),
                ));
            }
            Some(s) => s,
        };
        config.flags |= tcp_state::bits(i + 1, mode(state));
    }
    Ok(())
}

/// The program's [`tcp_state::mode`] of `s`.
const fn mode(s: TcpState) -> u8 {
    match s {
        TcpState::Off => tcp_state::mode::OFF,
        TcpState::Auto => tcp_state::mode::AUTO,
        TcpState::Always => tcp_state::mode::ALWAYS,
    }
}

#[cfg(test)]
mod tests {
    use limiter_common::tcp_state::{mode, of};

    use crate::policy::{Policy, Protocol, TcpState, tests::https_syn};

    fn compiled(p: &Policy) -> u32 {
        p.compile(1).expect("compiles").config.flags
    }

    #[test]
    fn left_out_it_is_auto_where_segments_other_than_syns_are_taken() {
        let mut p = Policy::default();
        let mut web = https_syn();
        web.name = "web".into();
        web.syn = false;
        let mut dns = https_syn();
        dns.name = "dns".into();
        dns.protocol = Protocol::Udp;
        dns.syn = false;
        p.classes = vec![https_syn(), web, dns];
        let flags = compiled(&p);
        assert_eq!(of(flags, 0), mode::AUTO, "the default class");
        assert_eq!(of(flags, 1), mode::OFF, "a syn = true class takes no other segment");
        assert_eq!(of(flags, 2), mode::AUTO, "a tcp class");
        assert_eq!(of(flags, 3), mode::OFF, "a udp class");
        p.tcp_state = TcpState::Off;
        p.classes[1].tcp_state = Some(TcpState::Always);
        let flags = compiled(&p);
        assert_eq!((of(flags, 0), of(flags, 2)), (mode::OFF, mode::ALWAYS));
    }

    #[test]
    fn asked_where_it_cannot_judge_it_names_the_field() {
        let mut p = Policy { classes: vec![https_syn()], ..Policy::default() };
        p.classes[0].tcp_state = Some(TcpState::Always);
        let e = p.compile(1).unwrap_err();
        assert_eq!(e.field, "class[0].tcp_state", "{e}");
        assert!(e.problem.contains("syn = true"), "{e}");
        p.classes[0].syn = false;
        p.classes[0].protocol = Protocol::Udp;
        let e = p.compile(1).unwrap_err();
        assert!(e.problem.contains("protocol"), "{e}");
        p.classes[0].tcp_state = Some(TcpState::Off);
        assert!(p.compile(1).is_ok());
    }
}
