//! What this build writes where another build reads it, against what
//! main's build wrote before the vocabulary became one (b338ea5, issue
//! 58): the pinned `RUNTIME` map's keys and values for every decider and
//! action (a restarted or rolled-back daemon reads the other's), and the
//! JSON of `prefix list` and of the upstream rules (what scripts read).
//! `compat/b338ea5.txt` is that build's output of the same values, made
//! by a test of that tree (`compat/b338ea5-golden.rs.txt`); it is not
//! this build's.

use limiter_common::{RuntimeKey, RuntimeOverride};

use crate::{
    control::{LayerEntry, PrefixEntry, PrefixList, Shown},
    origin::Origin,
    policy::{
        Action, CostUnit, Limit, Mode, OverrideAction,
        runtime::{decode, key, value},
    },
    upstream::rule::{self, Key, Rule},
};

/// The deciders of b338ea5, in its order.
const DECIDERS: [Origin; 5] = [Origin::Operator, Origin::File, Origin::Feedback, Origin::Escalation, Origin::Crowdsec];

/// The same values as b338ea5's test, written by this build.
fn lines() -> Vec<String> {
    let mut out = Vec::new();
    let nets: [ipnet::IpNet; 2] = ["198.18.7.0/24".parse().unwrap(), "2001:2:0:100::/56".parse().unwrap()];
    let limit = Limit { rate: 1000, burst: 2000, cost: CostUnit::Bytes, mode: Mode::Enforce, window: None };
    let actions = [None, Some(OverrideAction::Allow), Some(OverrideAction::Deny), Some(OverrideAction::Limit(limit))];
    for d in DECIDERS {
        for n in &nets {
            out.push(format!("KEY {} {n} {:?}", d.label(), key(n, d)));
            for a in &actions {
                out.push(format!("VALUE {} {a:?} {:?}", d.label(), value(a.as_ref(), 1234, d)));
            }
        }
    }
    let mut entries = Vec::new();
    for (i, d) in DECIDERS.into_iter().enumerate() {
        for (j, a) in [Action::Limit, Action::Allow, Action::Deny, Action::Unset].into_iter().enumerate() {
            let layer = LayerEntry {
                layer: Shown::shadow(d),
                action: a,
                rate: Some(5),
                burst: None,
                expires_in_secs: Some(60),
                in_force: j % 2 == 0,
            };
            entries.push(PrefixEntry {
                cidr: nets[(i + j) % 2],
                action: a,
                rate: Some(10 * i as u64),
                burst: Some(20),
                origin: if j == 3 { Shown::shadow(d) } else { Shown::of(d) },
                expires_in_secs: if j == 0 { None } else { Some(j as u64) },
                reason: Some("r".into()),
                source: if d == Origin::Crowdsec { Some("crowdsec:lists:x".into()) } else { None },
                layers: vec![layer],
            });
        }
    }
    out.push(format!("LIST {}", serde_json::to_string(&PrefixList { version: 7, entries, more: 3 }).unwrap()));
    let rules: Vec<Rule> = [Origin::Operator, Origin::Escalation, Origin::Pressure]
        .into_iter()
        .enumerate()
        .map(|(i, by)| Rule {
            key: Key::flow(nets[i % 2]),
            action: if i == 0 { rule::Action::Discard } else { rule::Action::RateLimit { bytes_per_sec: 125_000 } },
            by,
            since: 100,
            expires: 200,
        })
        .collect();
    out.push(format!("RULES {}", serde_json::to_string(&rules).unwrap()));
    out
}

#[test]
fn this_build_writes_the_pins_and_the_json_main_wrote() {
    let golden: Vec<&str> = include_str!("compat/b338ea5.txt").lines().collect();
    assert_eq!(golden.len(), 52, "the golden file holds 10 keys, 40 values and two JSON lines");
    let ours = lines();
    for (i, (theirs, ours)) in golden.iter().zip(&ours).enumerate() {
        assert_eq!(*theirs, ours, "line {} differs from b338ea5's", i + 1);
    }
    assert_eq!(ours.len(), golden.len());
    // And back: main's JSON reads as this build's types.
    let list: PrefixList = serde_json::from_str(golden[50].strip_prefix("LIST ").unwrap()).unwrap();
    assert_eq!(list.entries.len(), 20);
    assert_eq!(list.entries[3].origin, Shown::shadow(Origin::Operator));
    let rules: Vec<Rule> = serde_json::from_str(golden[51].strip_prefix("RULES ").unwrap()).unwrap();
    assert_eq!(
        rules.iter().map(|r| r.by).collect::<Vec<_>>(),
        [Origin::Operator, Origin::Escalation, Origin::Pressure]
    );
}

/// A record main's build pinned reads back, in this build, as the layer,
/// action and expiry it was written with.
#[test]
fn main_s_pinned_records_read_back_as_written() {
    let net: ipnet::IpNet = "198.18.7.0/24".parse().unwrap();
    for (by, pad, flag) in [(Origin::Operator, 0u8, 0u32), (Origin::Feedback, 1, 0x100), (Origin::Escalation, 2, 0x200)]
    {
        // b338ea5's deny of `net` by `by`, as its golden lines say.
        let k = RuntimeKey { pad: [pad, 0], ..key(&net, Origin::Operator) };
        let v = RuntimeOverride { action: 3 | flag, expires: 1234, ..RuntimeOverride::default() };
        assert_eq!(decode(&k, &v), Some((net, Some(OverrideAction::Deny), 1234, by)), "{by:?}");
    }
}
