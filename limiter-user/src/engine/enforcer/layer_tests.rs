//! Layers of decisions (operator > policy file > automation): for every
//! pair, the lower one never replaces or removes the higher one, and when
//! an overlay ends the entry beneath is in force again exactly as it was,
//! across a restart over the pinned record and a reload in between.

use limiter_common::RuntimeKey;

use super::*;
use crate::{
    dataplane::FakeMaps,
    policy::{Limit, feedback::Refusal, file, runtime},
};

const FEEDBACK: &str =
    "\n[feedback]\nlisten = \"127.0.0.1:9465\"\ntoken_file = \"/dev/null\"\nmax_denied = 2\nmax_ttl = \"1h\"\n";
const ESCALATE: &str =
    "\n[feedback.escalate]\ndrops_per_sec = 5000\nsustained = \"3s\"\ndeny_for = \"10m\"\nmax_denied = 1\n";

/// The file: a deny, an allow and a limit (with its own cost and mode),
/// then the feedback section (`extra` lines go into it) and escalation.
fn policy(extra: &str) -> String {
    format!(
        "rate = 1000\nburst = 2000\n\n[[override]]\ncidr = \"198.18.1.0/24\"\naction = \"deny\"\n\n[[override]]\ncidr = \"198.18.2.0/24\"\naction = \"allow\"\n\n[[override]]\ncidr = \"198.18.3.0/24\"\nrate = 77\nburst = 99\nmode = \"shadow\"\n{FEEDBACK}{extra}{ESCALATE}"
    )
}

fn loaded(text: &str) -> Loaded {
    file::parse("p.toml", text.to_owned()).unwrap()
}

fn started(maps: &mut FakeMaps, text: &str) -> Enforcer {
    let mut e = Enforcer::new(0, 1024);
    e.apply(maps, loaded(text)).unwrap();
    e
}

/// What is enforced for `cidr` now, from the effective policy.
fn enforced(e: &Enforcer, cidr: &str) -> Option<OverrideAction> {
    let net: IpNet = cidr.parse().unwrap();
    e.effective(e.base()).overrides.iter().find(|o| o.net == net).map(|o| o.action)
}

/// The last applied policy with its version taken out, to compare two.
fn last(maps: &FakeMaps) -> Compiled {
    let mut c = maps.applied.last().unwrap().clone();
    c.config.version = 0;
    c
}

fn penalize(e: &mut Enforcer, maps: &mut FakeMaps, cidr: &str, ttl: u64, by: Origin) -> Result<String, ApplyError> {
    let net = cidr.parse::<IpNet>().ok().filter(|n| n.trunc() == *n).ok_or_else(|| cidr.to_owned());
    e.penalize(maps, net.as_ref(), ttl, "test", by)
}

fn limit(rate: u64, burst: u64) -> OverrideAction {
    OverrideAction::Limit(Limit { rate, burst, ..Policy::default().default })
}

/// Restart over the same (pinned) record, then apply `text` (a reload
/// of the same file, or of a changed one).
fn restarted(maps: &mut FakeMaps, e: &Enforcer, text: &str) -> Enforcer {
    let mut again = Enforcer::new(e.version(), 1024);
    again.restore(maps).unwrap();
    again.apply(maps, loaded(text)).unwrap();
    again
}

#[test]
fn a_penalty_over_an_operator_deny_leaves_it_in_force_when_it_ends() {
    let mut maps = FakeMaps::default();
    let mut e = started(&mut maps, &policy(""));
    e.change_prefix(&mut maps, "198.18.7.0/24".parse().unwrap(), Some(OverrideAction::Deny), None, None).unwrap();
    let before = last(&maps);
    penalize(&mut e, &mut maps, "198.18.7.0/24", 1, Origin::Feedback).unwrap();
    assert_eq!(enforced(&e, "198.18.7.0/24"), Some(OverrideAction::Deny));
    let listed = e.prefixes().into_iter().find(|p| p.cidr.to_string() == "198.18.7.0/24").unwrap();
    assert_eq!(listed.origin, "runtime", "the operator's deny is the one in force");
    let layers: Vec<_> = listed.layers.iter().map(|l| (l.layer.label(), l.action.as_str(), l.in_force)).collect();
    assert_eq!(layers, [("runtime".to_owned(), "deny", true), ("feedback".to_owned(), "deny", false)]);
    // Through a restart and a reload, then the penalty's time is up.
    let mut e = restarted(&mut maps, &e, &policy(""));
    e.expire(&mut maps, crate::clock::unix_now() + 2).unwrap().unwrap();
    assert_eq!(enforced(&e, "198.18.7.0/24"), Some(OverrideAction::Deny), "the operator's deny is still there");
    assert_eq!(last(&maps), before, "the policy is as before the penalty");
    assert_eq!(maps.runtime.len(), 1, "only the penalty's record went");
}

#[test]
fn a_penalty_inside_an_allow_is_refused_unless_the_policy_lets_it_overlay() {
    let mut maps = FakeMaps::default();
    let mut e = started(&mut maps, &policy(""));
    e.change_prefix(&mut maps, "198.18.8.0/24".parse().unwrap(), Some(OverrideAction::Allow), None, None).unwrap();
    for (cidr, who) in [("198.18.8.0/24", "operator"), ("198.18.2.0/24", "policy file")] {
        for by in [Origin::Feedback, Origin::Escalation] {
            let err = penalize(&mut e, &mut maps, cidr, 60, by).unwrap_err();
            assert!(
                matches!(err, ApplyError::Governor { refusal: crate::policy::feedback::Refusal::Allowed, .. }),
                "{err}"
            );
            assert!(err.to_string().contains(who), "{err}");
        }
        assert_eq!(enforced(&e, cidr), Some(OverrideAction::Allow));
    }
    assert_eq!(e.governed().refused.get(Refusal::Allowed), 4);
    // Wider than the allow: taken, and the allow keeps its own addresses
    // (the longest prefix wins in XDP).
    penalize(&mut e, &mut maps, "198.18.0.0/16", 60, Origin::Feedback).unwrap();
    assert_eq!(enforced(&e, "198.18.8.0/24"), Some(OverrideAction::Allow));
    // With `may_override_allow`, a penalty overlays an allow and the allow
    // is back, as it was, when it ends.
    let text = policy("may_override_allow = true\n");
    let mut e = restarted(&mut maps, &e, &text);
    let before = last(&maps);
    // The operator lifts the /16 penalty (the tenant's cap is 2).
    e.change_prefix(&mut maps, "198.18.0.0/16".parse().unwrap(), None, None, None).unwrap();
    penalize(&mut e, &mut maps, "198.18.8.0/24", 5, Origin::Feedback).unwrap();
    penalize(&mut e, &mut maps, "198.18.2.0/24", 5, Origin::Feedback).unwrap();
    assert_eq!(enforced(&e, "198.18.8.0/24"), Some(OverrideAction::Deny));
    assert_eq!(enforced(&e, "198.18.2.0/24"), Some(OverrideAction::Deny));
    let mut e = restarted(&mut maps, &e, &text);
    e.expire(&mut maps, crate::clock::unix_now() + 6).unwrap().unwrap();
    assert_eq!(enforced(&e, "198.18.8.0/24"), Some(OverrideAction::Allow));
    assert_eq!(enforced(&e, "198.18.2.0/24"), Some(OverrideAction::Allow));
    let mut without_the_16 = before.clone();
    without_the_16.overrides.v4.retain(|(len, ..)| *len != 16);
    assert_eq!(last(&maps), without_the_16);
}

#[test]
fn a_penalty_overlays_a_limit_and_the_limit_comes_back_exactly() {
    let mut maps = FakeMaps::default();
    let mut e = started(&mut maps, &policy(""));
    // The operator's limit and the file's (shadow).
    e.change_prefix(&mut maps, "198.18.9.0/24".parse().unwrap(), Some(limit(100, 200)), None, None).unwrap();
    let file_limit = enforced(&e, "198.18.3.0/24").unwrap();
    let before = last(&maps);
    penalize(&mut e, &mut maps, "198.18.9.0/24", 1, Origin::Feedback).unwrap();
    penalize(&mut e, &mut maps, "198.18.3.0/24", 1, Origin::Feedback).unwrap();
    for cidr in ["198.18.9.0/24", "198.18.3.0/24"] {
        assert_eq!(enforced(&e, cidr), Some(OverrideAction::Deny), "{cidr}");
    }
    let listed = e.prefixes().into_iter().find(|p| p.cidr.to_string() == "198.18.9.0/24").unwrap();
    assert_eq!((listed.action.as_str(), listed.origin.label().as_str()), ("deny", "feedback"));
    assert_eq!(listed.layers[0].rate, Some(100), "the limit is listed beneath");
    let mut e = restarted(&mut maps, &e, &policy(""));
    e.expire(&mut maps, crate::clock::unix_now() + 2).unwrap().unwrap();
    assert_eq!(enforced(&e, "198.18.9.0/24"), Some(limit(100, 200)));
    assert_eq!(enforced(&e, "198.18.3.0/24"), Some(file_limit), "rate, burst and mode as they were");
    assert_eq!(last(&maps), before);
}

#[test]
fn the_operator_outranks_the_file_and_lifts_penalties() {
    let mut maps = FakeMaps::default();
    let mut e = started(&mut maps, &policy(""));
    // Operator over the file: allow where the file denies, then unset.
    e.change_prefix(&mut maps, "198.18.1.0/24".parse().unwrap(), Some(OverrideAction::Allow), None, None).unwrap();
    assert_eq!(enforced(&e, "198.18.1.0/24"), Some(OverrideAction::Allow));
    let mut e = restarted(&mut maps, &e, &policy(""));
    e.change_prefix(&mut maps, "198.18.1.0/24".parse().unwrap(), None, None, None).unwrap();
    assert_eq!(enforced(&e, "198.18.1.0/24"), None, "unset removes the file's override too");
    // A penalty under the operator's deny of another prefix: the
    // operator's own unset removes its deny only, the next the penalty.
    e.change_prefix(&mut maps, "198.18.6.0/24".parse().unwrap(), Some(OverrideAction::Deny), None, None).unwrap();
    penalize(&mut e, &mut maps, "198.18.6.0/24", 600, Origin::Feedback).unwrap();
    e.change_prefix(&mut maps, "198.18.6.0/24".parse().unwrap(), None, None, None).unwrap();
    assert_eq!(enforced(&e, "198.18.6.0/24"), Some(OverrideAction::Deny), "the penalty is still there");
    assert_eq!(e.prefixes().iter().find(|p| p.cidr.to_string() == "198.18.6.0/24").unwrap().origin, "feedback");
    e.change_prefix(&mut maps, "198.18.6.0/24".parse().unwrap(), None, None, None).unwrap();
    assert_eq!(enforced(&e, "198.18.6.0/24"), None);
    // A reload that drops the file's deny keeps the layers above and below.
    penalize(&mut e, &mut maps, "198.18.5.0/24", 600, Origin::Feedback).unwrap();
    let trimmed = policy("")
        .replace("cidr = \"198.18.1.0/24\"\naction = \"deny\"", "cidr = \"198.18.4.0/24\"\naction = \"deny\"");
    let e = restarted(&mut maps, &e, &trimmed);
    assert_eq!(enforced(&e, "198.18.5.0/24"), Some(OverrideAction::Deny));
    assert_eq!(enforced(&e, "198.18.4.0/24"), Some(OverrideAction::Deny));
}

/// An escalation denies the address, in the deny set (origin
/// `escalation`), never the bucket (a /24 override would cost its
/// neighbours everything); it has a cap of its
/// own, is recorded with its end so a restart keeps it, ends on time, and
/// the operator's unset lifts it.
#[test]
fn an_escalation_is_an_address_in_the_deny_set_with_a_cap_and_an_end_of_its_own() {
    let mut maps = FakeMaps::default();
    let mut e = started(&mut maps, &policy(""));
    let (bucket, addr) = ("198.18.10.0/24", "198.18.10.7/32");
    penalize(&mut e, &mut maps, bucket, 1, Origin::Feedback).unwrap();
    penalize(&mut e, &mut maps, addr, 600, Origin::Escalation).unwrap();
    assert_eq!(maps.runtime.len(), 2, "one record each");
    assert_eq!(enforced(&e, addr), None, "an escalation is no override");
    assert_eq!(maps.deny.len(), 2, "the /32 and its bucket's marker");
    assert_eq!(maps.deny_origins, ["escalation"]);
    // The escalation cap (1) is full; the tenant's (2) is not.
    let err = penalize(&mut e, &mut maps, "198.18.11.7/32", 60, Origin::Escalation).unwrap_err();
    assert!(err.to_string().contains("feedback.escalate.max_denied"), "{err}");
    penalize(&mut e, &mut maps, "198.18.11.0/24", 60, Origin::Feedback).unwrap();
    let err = penalize(&mut e, &mut maps, "198.18.12.0/24", 60, Origin::Feedback).unwrap_err();
    assert!(err.to_string().contains("(max_denied)"), "{err}");
    // A restart keeps it, with its end; the feedback's ends first.
    let mut e = restarted(&mut maps, &e, &policy(""));
    e.expire(&mut maps, crate::clock::unix_now() + 2).unwrap().unwrap();
    let listed = e.prefixes().into_iter().find(|p| p.cidr.to_string() == addr).unwrap();
    assert_eq!(listed.origin, "escalation");
    assert!(listed.expires_in_secs.is_some_and(|s| (590..=600).contains(&s)), "{listed:?}");
    assert_eq!(maps.deny.len(), 2);
    assert_eq!(e.deny_layer().counts()[&"escalation".to_owned()], 1);
    // Its end lifts it, record and all.
    e.expire(&mut maps, crate::clock::unix_now() + 601).unwrap().unwrap();
    assert!(maps.deny.is_empty() && e.escalations().is_empty());
    assert!(maps.runtime.is_empty(), "records left: {:?}", maps.runtime);
    // The operator outranks it: an unset lifts it at once.
    penalize(&mut e, &mut maps, addr, 600, Origin::Escalation).unwrap();
    let line = e.change_prefix(&mut maps, addr.parse().unwrap(), None, None, None).unwrap();
    assert!(line.contains("lifted by the operator"), "{line}");
    assert!(maps.deny.is_empty() && e.escalations().is_empty());
    // The deny set lies beneath every allow: refused there, whatever the policy.
    let mut e = started(&mut maps, &policy("may_override_allow = true\n"));
    let err = penalize(&mut e, &mut maps, "198.18.2.7/32", 60, Origin::Escalation).unwrap_err();
    assert!(err.to_string().contains("governor: allowed"), "{err}");
}

/// A record of escalation from a build that kept escalations as
/// overrides of whole buckets: moved into the deny set at a restart (the
/// bucket stays denied until its end, as that build said), then lifted.
#[test]
fn an_escalation_of_an_older_build_moves_into_the_deny_set() {
    let mut maps = FakeMaps::default();
    let e = started(&mut maps, &policy(""));
    let net: IpNet = "198.18.13.0/24".parse().unwrap();
    let end = u32::try_from(crate::clock::unix_now() + 30).unwrap();
    let value = runtime::value(Some(&OverrideAction::Deny), end, Origin::Escalation);
    maps.set_runtime_override(&runtime::key(&net, Origin::Escalation), Some(&value)).unwrap();
    let mut e = restarted(&mut maps, &e, &policy(""));
    assert_eq!(enforced(&e, "198.18.13.0/24"), None);
    assert_eq!(maps.deny.len(), 1);
    e.expire(&mut maps, crate::clock::unix_now() + 31).unwrap().unwrap();
    assert!(maps.deny.is_empty() && maps.runtime.is_empty());
}

#[test]
fn a_record_of_a_build_before_layers_is_moved_under_its_layer() {
    let mut maps = FakeMaps::default();
    let e = started(&mut maps, &policy(""));
    let net: IpNet = "198.18.12.0/24".parse().unwrap();
    let old_key = RuntimeKey { pad: [0; 2], ..runtime::key(&net, Origin::Feedback) };
    let value = runtime::value(Some(&OverrideAction::Deny), 1, Origin::Feedback);
    maps.set_runtime_override(&old_key, Some(&value)).unwrap();
    let mut e = restarted(&mut maps, &e, &policy(""));
    let keys: Vec<RuntimeKey> = maps.runtime.values().map(|(k, _)| *k).collect();
    assert_eq!(keys, [runtime::key(&net, Origin::Feedback)]);
    e.expire(&mut maps, crate::clock::unix_now() + 2).unwrap().unwrap();
    assert!(maps.runtime.is_empty(), "its removal found it");
}

#[test]
fn a_reload_that_lifts_most_overrides_or_cuts_a_rate_tenfold_is_refused_unless_asked() {
    let mut maps = FakeMaps::default();
    let mut e = started(&mut maps, &policy(""));
    // Cut to `rate = 10`: every override lifted, the rate cut 100x.
    let err = e.apply_guarded(&mut maps, loaded("rate = 10\n"), false).unwrap_err().to_string();
    assert!(err.contains("lifts 3 of the 3 overrides in force (1 of them denies)"), "{err}");
    assert!(err.contains("cuts the default rate from 1000 to 10") && err.contains("allow_shrink = true"), "{err}");
    assert_eq!(e.version(), 1, "nothing applied");
    // One override of three lifted, the rate halved: taken.
    let lighter = policy("")
        .replacen("rate = 1000", "rate = 500", 1)
        .replace("cidr = \"198.18.2.0/24\"\naction = \"allow\"", "cidr = \"198.18.4.0/24\"\naction = \"allow\"");
    e.apply_guarded(&mut maps, loaded(&lighter), false).unwrap();
    // Asked for: by the file, or by --force.
    e.apply_guarded(&mut maps, loaded("allow_shrink = true\nrate = 10\n"), false).unwrap();
    assert_eq!(e.base().default.rate, 10);
    let mut e = started(&mut FakeMaps::default(), &policy(""));
    e.apply_guarded(&mut maps, loaded("rate = 10\n"), true).unwrap();
    assert_eq!(e.base().default.rate, 10);
}

/// A `[[source]]`'s networks sit below the operator and the file and
/// above automation: the file's override and the operator's win on their
/// network, a penalty inside a source's allow is refused, an unset by the
/// operator gives the source's decision back, and a version the policy
/// cannot hold (a section gone) decides nothing.
#[test]
fn a_source_sits_below_the_operator_and_the_file_and_above_automation() {
    let mut maps = FakeMaps::default();
    let source = "\n[[source]]\nname = \"office\"\nkind = \"plain\"\npath = \"/office\"\n";
    let text = format!("{}{source}", policy(""));
    let mut e = started(&mut maps, &text);
    let spec = e.base().sources[0].clone();
    let nets = ["198.18.2.0/24", "198.18.5.7/32", "198.18.6.0/24"].iter().map(|n| n.parse().unwrap()).collect();
    let line = e.source_version(&mut maps, &spec, nets).unwrap();
    assert!(line.starts_with("source office: 3 networks (allow)"), "{line}");
    assert_eq!(enforced(&e, "198.18.5.0/24"), Some(OverrideAction::Allow), "an address counts for its bucket");
    let listed = e.prefixes().into_iter().find(|p| p.cidr.to_string() == "198.18.5.0/24").unwrap();
    assert_eq!((listed.origin.label(), listed.source.as_deref()), ("source".to_owned(), Some("source:office")));
    // The file's own allow of 198.18.2.0/24 is the one in force there.
    let listed = e.prefixes().into_iter().find(|p| p.cidr.to_string() == "198.18.2.0/24").unwrap();
    assert_eq!(listed.origin.label(), "file");
    let layers: Vec<_> = listed.layers.iter().map(|l| (l.layer.label(), l.in_force)).collect();
    assert_eq!(layers, [("file".to_owned(), true), ("source".to_owned(), false)]);
    // Automation does not override it.
    let e2 = penalize(&mut e, &mut maps, "198.18.6.0/24", 60, Origin::Feedback).unwrap_err();
    assert!(e2.to_string().contains("[[source]] file"), "{e2}");
    // The operator does, and an unset of theirs gives it back.
    let net: IpNet = "198.18.6.0/24".parse().unwrap();
    e.change_prefix(&mut maps, net, Some(OverrideAction::Deny), None, None).unwrap();
    assert_eq!(enforced(&e, "198.18.6.0/24"), Some(OverrideAction::Deny));
    e.change_prefix(&mut maps, net, None, None, None).unwrap();
    assert_eq!(enforced(&e, "198.18.6.0/24"), Some(OverrideAction::Allow));
    // A reload without the section: its networks go with it.
    e.apply(&mut maps, loaded(&policy(""))).unwrap();
    assert_eq!(enforced(&e, "198.18.6.0/24"), None);
    assert_eq!(e.source_sets().count(), 0);
    // A version the policy cannot hold is refused and the last stays.
    let mut e = started(&mut maps, &text);
    e.source_version(&mut maps, &spec, ["198.18.6.0/24".parse().unwrap()].into()).unwrap();
    let wide = e.source_version(&mut maps, &spec, ["0.0.0.0/0".parse().unwrap()].into()).unwrap_err();
    assert!(wide.to_string().contains("wider"), "{wide}");
    assert_eq!(enforced(&e, "198.18.6.0/24"), Some(OverrideAction::Allow));
}

/// The operator's `--reason` is listed with their entry while it is in
/// force, and goes with it (unset, replaced without one, expired).
#[test]
fn an_operator_reason_is_listed_with_the_entry_and_goes_with_it() {
    let mut maps = FakeMaps::default();
    let mut e = started(&mut maps, &policy(""));
    let net: IpNet = "198.18.7.0/24".parse().unwrap();
    let reason_of = |e: &Enforcer| e.prefixes().into_iter().find(|p| p.cidr == net).and_then(|p| p.reason);
    e.change_prefix(&mut maps, net, Some(OverrideAction::Deny), None, Some("INC-4711")).unwrap();
    assert_eq!(reason_of(&e).as_deref(), Some("INC-4711"));
    e.change_prefix(&mut maps, net, Some(OverrideAction::Allow), None, None).unwrap();
    assert_eq!(reason_of(&e), None, "a change without a reason kept the old one");
    e.change_prefix(&mut maps, net, Some(OverrideAction::Deny), Some(1), Some("for a second")).unwrap();
    assert_eq!(reason_of(&e).as_deref(), Some("for a second"));
    e.expire(&mut maps, crate::clock::unix_now() + 2).unwrap().unwrap();
    e.change_prefix(&mut maps, net, Some(OverrideAction::Deny), None, None).unwrap();
    assert_eq!(reason_of(&e), None, "an expired entry's reason came back");
}

/// `prefix unset --origin` and `--all`: every entry of a layer goes in
/// one version, the others stay, the file's overrides stay, and a layer
/// with nothing to unset is refused.
#[test]
fn a_layer_is_unset_whole_in_one_version_and_the_others_stay() {
    let mut maps = FakeMaps::default();
    let mut e = started(&mut maps, &policy(""));
    for (net, action) in [("198.18.7.0/24", OverrideAction::Deny), ("198.18.8.0/24", OverrideAction::Allow)] {
        e.change_prefix(&mut maps, net.parse().unwrap(), Some(action), None, Some("ops")).unwrap();
    }
    penalize(&mut e, &mut maps, "198.18.9.0/24", 600, Origin::Feedback).unwrap();
    let version = e.version();
    let line = e.unset_all(&mut maps, &[Origin::Feedback]).unwrap();
    assert!(line.starts_with("1 entries unset"), "{line}");
    assert_eq!(e.version(), version + 1, "one version");
    assert_eq!(enforced(&e, "198.18.9.0/24"), None);
    assert_eq!(enforced(&e, "198.18.7.0/24"), Some(OverrideAction::Deny), "the operator's went with feedback's");
    let again = e.unset_all(&mut maps, &[Origin::Feedback]).unwrap_err();
    assert!(again.to_string().contains("no entry of feedback"), "{again}");
    e.unset_all(&mut maps, &[Origin::Operator, Origin::Feedback, Origin::Escalation]).unwrap();
    assert_eq!((enforced(&e, "198.18.7.0/24"), enforced(&e, "198.18.8.0/24")), (None, None));
    assert_eq!(enforced(&e, "198.18.1.0/24"), Some(OverrideAction::Deny), "the file's override went");
    assert!(e.prefixes().iter().all(|p| p.reason.is_none()), "a reason outlived its entry");
    assert!(e.unset_all(&mut maps, &[Origin::File]).is_err(), "the file's overrides are the file's");
}
