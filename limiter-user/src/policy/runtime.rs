//! Overrides set at run time (`limiter prefix ...`) as entries of the
//! pinned `RUNTIME` map, so that a restarted daemon puts them back: an
//! operator's `deny` must outlive an upgrade or a crash of the daemon just
//! as the data plane does (invariant 5, docs/design.md).

use std::net::IpAddr;

use super::{CostUnit, Limit, Mode, OverrideAction};
use crate::origin::Origin;
use ipnet::IpNet;
use limiter_common::{RuntimeKey, RuntimeOverride, family, runtime_action};

/// The map key of `net`'s entry of layer `by`: each layer of decisions
/// about a network is an entry of its own (its code in `pad[0]`; records
/// of builds before layers have 0 there, whoever set them), so a penalty
/// never overwrites the operator's entry and a restart restores the stack.
#[must_use]
pub fn key(net: &IpNet, by: Origin) -> RuntimeKey {
    RuntimeKey { pad: [by.runtime_code(), 0], ..net_key(net) }
}

fn net_key(net: &IpNet) -> RuntimeKey {
    let mut addr = [0; 16];
    let fam = match net.addr() {
        IpAddr::V4(a) => {
            addr[..4].copy_from_slice(&a.octets());
            family::IPV4
        }
        IpAddr::V6(a) => {
            addr = a.octets();
            family::IPV6
        }
    };
    RuntimeKey { family: fam, prefix_len: net.prefix_len(), pad: [0; 2], addr }
}

/// Set in [`RuntimeOverride::action`] when the override came from the
/// tenant layer's feedback (not an operator).
pub const FROM_FEEDBACK: u32 = 0x100;
/// Set in [`RuntimeOverride::action`] when the override came from the
/// daemon's own escalation.
pub const FROM_ESCALATION: u32 = 0x200;

/// The flag of `by`'s layer in [`RuntimeOverride::action`] (the
/// operator's, and the layers never recorded here, have none).
const fn flag(by: Origin) -> u32 {
    match by {
        Origin::Feedback => FROM_FEEDBACK,
        Origin::Escalation => FROM_ESCALATION,
        _ => 0,
    }
}

/// The layer whose flag `action` carries.
fn layer_of(action: u32) -> Origin {
    if action & FROM_ESCALATION != 0 {
        Origin::Escalation
    } else if action & FROM_FEEDBACK != 0 {
        Origin::Feedback
    } else {
        Origin::Operator
    }
}

/// The map value of a runtime override (`None`: the file's is removed),
/// expiring at Unix time `expires` (0 = never).
#[must_use]
pub fn value(action: Option<&OverrideAction>, expires: u32, origin: Origin) -> RuntimeOverride {
    let v = value_of(action);
    RuntimeOverride { expires, action: v.action | flag(origin), ..v }
}

fn value_of(action: Option<&OverrideAction>) -> RuntimeOverride {
    let code = |action| RuntimeOverride { action, ..RuntimeOverride::default() };
    match action {
        None => code(runtime_action::UNSET),
        Some(OverrideAction::Allow) => code(runtime_action::ALLOW),
        Some(OverrideAction::Deny) => code(runtime_action::DENY),
        Some(OverrideAction::Limit(l)) => RuntimeOverride {
            action: runtime_action::LIMIT,
            cost: l.cost.into(),
            mode: l.mode.into(),
            expires: 0,
            rate: l.rate,
            burst: l.burst,
        },
    }
}

/// A map entry back as a network, its override, when it expires (0 =
/// never) and who set it; `None` for an entry this
/// build does not understand (it is skipped, and said so). Who set it is
/// read from the value: a record of a build before layers has no layer
/// in its key (see [`stale_key`]).
#[must_use]
pub fn decode(k: &RuntimeKey, v: &RuntimeOverride) -> Option<(IpNet, Option<OverrideAction>, u32, Origin)> {
    let addr = match k.family {
        family::IPV4 => IpAddr::from([k.addr[0], k.addr[1], k.addr[2], k.addr[3]]),
        family::IPV6 => IpAddr::from(k.addr),
        _ => return None,
    };
    let net = IpNet::new(addr, k.prefix_len).ok()?;
    let action = match v.action & !(FROM_FEEDBACK | FROM_ESCALATION) {
        runtime_action::UNSET => None,
        runtime_action::ALLOW => Some(OverrideAction::Allow),
        runtime_action::DENY => Some(OverrideAction::Deny),
        runtime_action::LIMIT => Some(OverrideAction::Limit(Limit {
            rate: v.rate,
            burst: v.burst,
            cost: CostUnit::try_from(v.cost).ok()?,
            mode: Mode::try_from(v.mode).ok()?,
            window: None,
        })),
        _ => return None,
    };
    Some((net, action, v.expires, layer_of(v.action)))
}

/// Whether `k` is not where this build keeps the record of its layer
/// (written by a build before layers): it is then moved.
#[must_use]
pub fn stale_key(k: &RuntimeKey, by: Origin) -> bool {
    k.pad != [by.runtime_code(), 0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_override_round_trips() {
        let limit = |cost, mode| OverrideAction::Limit(Limit { rate: 7, burst: 1 << 40, cost, mode, window: None });
        let cases: [(&str, Option<OverrideAction>); 6] = [
            ("198.18.1.0/24", Some(OverrideAction::Deny)),
            ("2001:2::/48", Some(OverrideAction::Allow)),
            ("198.18.0.0/15", None),
            ("0.0.0.0/0", Some(limit(CostUnit::Packets, Mode::Enforce))),
            ("2001:2:0:1::/64", Some(limit(CostUnit::Bytes, Mode::Shadow))),
            ("198.19.255.255/32", Some(limit(CostUnit::Bytes, Mode::Enforce))),
        ];
        for ((cidr, action), origin) in
            cases.into_iter().zip([Origin::Feedback, Origin::Escalation, Origin::Operator].repeat(2))
        {
            let net: IpNet = cidr.parse().unwrap();
            let back = decode(&key(&net, origin), &value(action.as_ref(), 1_900_000_000, origin));
            assert!(!stale_key(&key(&net, origin), origin));
            assert_eq!(back, Some((net, action, 1_900_000_000, origin)), "{cidr}");
        }
    }

    #[test]
    fn entries_of_another_build_are_skipped() {
        let net: IpNet = "198.18.1.0/24".parse().unwrap();
        let bad_action = RuntimeOverride { action: 99, ..value(None, 0, Origin::Operator) };
        assert_eq!(decode(&key(&net, Origin::Operator), &bad_action), None);
        let bad_family = RuntimeKey { family: limiter_common::Family(9), ..key(&net, Origin::Operator) };
        assert_eq!(decode(&bad_family, &value(None, 0, Origin::Operator)), None);
        let bad_len = RuntimeKey { prefix_len: 33, ..key(&net, Origin::Operator) };
        assert_eq!(decode(&bad_len, &value(None, 0, Origin::Operator)), None);
    }

    #[test]
    fn layers_of_one_network_are_entries_of_their_own() {
        let net: IpNet = "198.18.7.0/24".parse().unwrap();
        let keys = [Origin::Operator, Origin::Feedback, Origin::Escalation].map(|by| key(&net, by));
        assert!(keys[0] != keys[1] && keys[1] != keys[2] && keys[0] != keys[2]);
        // A record of a build before layers: a penalty under the layer-less key.
        let old = RuntimeKey { pad: [0; 2], ..key(&net, Origin::Feedback) };
        let (_, _, _, by) = decode(&old, &value(Some(&OverrideAction::Deny), 5, Origin::Feedback)).unwrap();
        assert_eq!(by, Origin::Feedback);
        assert!(stale_key(&old, by) && !stale_key(&old, Origin::Operator));
    }
}
