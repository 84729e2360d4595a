//! The daemon's policy logic against in-memory maps: what reaches the
//! kernel, in what order, and what survives a failure or a restart.

use limiter_common::resolution;

use super::*;
use crate::{
    dataplane::FakeMaps,
    policy::{Limit, compile::COMPILES, file},
};

fn loaded(text: &str) -> Loaded {
    file::parse("p.toml", text.to_owned()).unwrap()
}

const FILE: &str = "rate = 500\nburst = 900\n\n[[override]]\ncidr = \"198.18.1.0/24\"\naction = \"deny\"\n\n[[override]]\ncidr = \"198.18.2.0/24\"\naction = \"allow\"\n";

fn started(maps: &mut FakeMaps) -> Enforcer {
    let mut e = Enforcer::new(0, 1024);
    e.apply(maps, loaded(FILE)).unwrap();
    e
}

/// Trie codes of the last applied policy's IPv4 overrides, by third octet.
fn v4_codes(maps: &FakeMaps) -> Vec<(u8, u32)> {
    let last = maps.applied.last().unwrap();
    last.overrides.v4.iter().map(|(_, addr, code)| (addr.to_ne_bytes()[2], *code)).collect()
}

#[test]
fn an_apply_compiles_once_and_writes_one_version() {
    let mut maps = FakeMaps::default();
    COMPILES.with(|c| c.set(0));
    let mut e = started(&mut maps);
    assert_eq!(COMPILES.with(std::cell::Cell::get), 1, "start-up apply");
    e.change_prefix(&mut maps, "198.18.3.0/24".parse().unwrap(), Some(OverrideAction::Deny), None, None).unwrap();
    assert_eq!(COMPILES.with(std::cell::Cell::get), 2, "one more for a prefix change");
    e.apply(&mut maps, loaded(FILE)).unwrap();
    assert_eq!(COMPILES.with(std::cell::Cell::get), 3, "one more for a reload");
    assert_eq!(maps.applied.iter().map(|c| c.config.version).collect::<Vec<_>>(), [1, 2, 3]);
    assert_eq!(e.version(), 3);
    assert_eq!(
        maps.applied[0].config.classes[0],
        Limit { rate: 500, burst: 900, ..Policy::default().default }.to_kernel("").unwrap()
    );
}

#[test]
fn a_start_with_nothing_to_put_back_reuses_the_check() {
    let mut maps = FakeMaps::default();
    let l = loaded(FILE);
    COMPILES.with(|c| c.set(0));
    let checked = l.check().unwrap();
    let mut e = Enforcer::new(4, 1024);
    e.apply_checked(&mut maps, l, checked.clone()).unwrap();
    assert_eq!(COMPILES.with(std::cell::Cell::get), 1, "the check is the only compile");
    assert_eq!(maps.applied[0].config.version, 5, "stamped with the next version");
    assert_eq!(maps.applied[0].overrides, checked.overrides);
    // With runtime overrides to put back, the effective policy is compiled.
    let mut maps = FakeMaps::default();
    let mut e = started(&mut maps);
    e.change_prefix(&mut maps, "198.18.3.0/24".parse().unwrap(), Some(OverrideAction::Deny), None, None).unwrap();
    let mut restarted = Enforcer::new(e.version(), 1024);
    restarted.restore(&mut maps).unwrap();
    let l = loaded(FILE);
    let checked = l.check().unwrap();
    restarted.apply_checked(&mut maps, l, checked).unwrap();
    assert_eq!(v4_codes(&maps).len(), 3, "the runtime deny is in the applied policy");
}

#[test]
fn a_bad_policy_changes_nothing_and_names_its_line() {
    let mut maps = FakeMaps::default();
    let mut e = started(&mut maps);
    let err = e.apply(&mut maps, loaded("rate = 0\n")).unwrap_err();
    assert_eq!(err.to_string(), "p.toml:1: rate: 0 is outside 1..=16000000000");
    assert_eq!((maps.applied.len(), e.version(), e.base().default.rate), (1, 1, 500));
}

#[test]
fn a_kernel_failure_leaves_version_and_runtime_record_as_they_were() {
    let mut maps = FakeMaps::default();
    let mut e = started(&mut maps);
    maps.fail_apply = true;
    let err = e
        .change_prefix(&mut maps, "198.18.3.0/24".parse().unwrap(), Some(OverrideAction::Deny), None, None)
        .unwrap_err();
    assert!(matches!(err, ApplyError::Load(_)), "{err}");
    assert_eq!(e.version(), 1);
    assert!(maps.runtime.is_empty(), "the record is taken back when the apply fails");
    assert_eq!(e.prefixes().len(), 2);
    // A failed record applies nothing at all.
    maps.fail_runtime = true;
    assert!(
        e.change_prefix(&mut maps, "198.18.3.0/24".parse().unwrap(), Some(OverrideAction::Deny), None, None).is_err()
    );
    assert_eq!((maps.applied.len(), e.version()), (1, 1));
}

#[test]
fn runtime_overrides_replace_file_ones_in_place_and_unset_removes_them() {
    let mut maps = FakeMaps::default();
    let mut e = started(&mut maps);
    e.change_prefix(&mut maps, "198.18.1.0/24".parse().unwrap(), Some(OverrideAction::Allow), None, None).unwrap();
    e.change_prefix(&mut maps, "198.18.0.0/16".parse().unwrap(), Some(OverrideAction::Deny), None, None).unwrap();
    assert_eq!(v4_codes(&maps), [(1, resolution::ALLOW), (2, resolution::ALLOW), (0, resolution::DENY)]);
    e.change_prefix(&mut maps, "198.18.2.0/24".parse().unwrap(), None, None, None).unwrap();
    assert_eq!(v4_codes(&maps), [(1, resolution::ALLOW), (0, resolution::DENY)]);
    let origins: Vec<_> = e.prefixes().into_iter().map(|p| (p.cidr.to_string(), p.origin.to_string())).collect();
    assert_eq!(origins, [("198.18.1.0/24".into(), "runtime".into()), ("198.18.0.0/16".into(), "runtime".into())]);
    let err = e.change_prefix(&mut maps, "198.18.9.0/24".parse().unwrap(), None, None, None).unwrap_err();
    assert_eq!(err.to_string(), "198.18.9.0/24 has no override");
}

#[test]
fn a_restarted_daemon_puts_runtime_overrides_back_over_the_file() {
    let mut maps = FakeMaps::default();
    let mut e = started(&mut maps);
    e.change_prefix(&mut maps, "198.18.3.0/24".parse().unwrap(), Some(OverrideAction::Deny), None, None).unwrap();
    e.change_prefix(&mut maps, "198.18.2.0/24".parse().unwrap(), None, None, None).unwrap();
    let limit = Limit { rate: 5, burst: 9, ..Policy::default().default };
    e.change_prefix(&mut maps, "198.18.4.0/24".parse().unwrap(), Some(OverrideAction::Limit(limit)), None, None)
        .unwrap();
    e.change_prefix(&mut maps, "198.18.4.0/24".parse().unwrap(), None, None, None).unwrap();
    let before = e.prefixes();
    // A new daemon over the same (pinned) maps, version continued.
    let mut again = Enforcer::new(maps.active_config().unwrap().unwrap().version, 1024);
    assert_eq!(again.restore(&mut maps).unwrap(), 2, "the deny and the file override's removal");
    again.apply(&mut maps, loaded(FILE)).unwrap();
    assert_eq!(again.prefixes(), before);
    assert_eq!(again.version(), 6);
}

#[test]
fn an_error_of_a_runtime_override_says_so() {
    let mut maps = FakeMaps::default();
    let mut e = started(&mut maps);
    // /25 is finer than the /24 buckets.
    let err = e
        .change_prefix(&mut maps, "198.18.3.0/25".parse().unwrap(), Some(OverrideAction::Deny), None, None)
        .unwrap_err();
    assert!(err.to_string().contains("198.18.3.0/25 is longer than the bucket prefix /24"), "{err}");
    assert_eq!(e.prefixes().len(), 2);
    assert!(maps.runtime.is_empty());
}

#[test]
fn runtime_overrides_that_no_longer_fit_are_dropped_at_restart() {
    let mut maps = FakeMaps::default();
    let mut e = started(&mut maps);
    e.change_prefix(&mut maps, "198.18.3.0/24".parse().unwrap(), Some(OverrideAction::Deny), None, None).unwrap();
    e.change_prefix(&mut maps, "198.18.0.0/16".parse().unwrap(), Some(OverrideAction::Allow), None, None).unwrap();
    // Restarted with /16 buckets: the /24 deny cannot be held any more.
    let coarse = loaded("v4_prefix = 16\n");
    let mut again = Enforcer::new(e.version(), 1024);
    assert_eq!(again.restore(&mut maps).unwrap(), 2);
    let dropped = again.drop_unfit(&coarse.policy);
    assert_eq!(dropped, ["198.18.3.0/24 (finer than the policy's /16 buckets)"]);
    again.apply(&mut maps, coarse).unwrap();
    assert_eq!(again.prefixes().len(), 1, "the /16 allow stays");
    // Set aside, not lost: it stays in the pinned record, and a restart
    // with /24 buckets again puts it back.
    assert_eq!(maps.runtime.len(), 2, "the unfit one is kept in the record");
    let mut back = Enforcer::new(again.version(), 1024);
    assert_eq!(back.restore(&mut maps).unwrap(), 2);
    assert!(back.drop_unfit(&loaded(FILE).policy).is_empty());
    back.apply(&mut maps, loaded(FILE)).unwrap();
    assert!(back.prefixes().iter().any(|p| p.cidr.to_string() == "198.18.3.0/24" && p.action == "deny"));
}

#[test]
fn an_override_with_a_ttl_expires_and_a_file_override_comes_back() {
    let mut maps = FakeMaps::default();
    let mut e = started(&mut maps);
    // The file denies 198.18.1.0/24; for 60 s it is allowed instead.
    e.change_prefix(&mut maps, "198.18.1.0/24".parse().unwrap(), Some(OverrideAction::Allow), Some(60), None).unwrap();
    e.change_prefix(&mut maps, "198.18.7.0/24".parse().unwrap(), Some(OverrideAction::Deny), Some(600), None).unwrap();
    assert_eq!(v4_codes(&maps)[0], (1, resolution::ALLOW));
    let now = crate::clock::unix_now();
    assert!(e.next_expiry().is_some_and(|t| (now + 59..=now + 60).contains(&t)), "{:?}", e.next_expiry());
    let left = e.prefixes().iter().find(|p| p.cidr.to_string() == "198.18.1.0/24").unwrap().expires_in_secs.unwrap();
    assert!((58..=60).contains(&left), "{left}");
    assert!(e.expire(&mut maps, now + 30).is_none(), "nothing due yet");
    e.expire(&mut maps, now + 61).unwrap().unwrap();
    assert_eq!(v4_codes(&maps), [(1, resolution::DENY), (2, resolution::ALLOW), (7, resolution::DENY)]);
    assert_eq!(maps.runtime.len(), 1, "the expired record is gone, the other kept");
    // A restarted daemon keeps the expiry of what it puts back.
    let mut again = Enforcer::new(e.version(), 1024);
    again.restore(&mut maps).unwrap();
    assert!(again.next_expiry().is_some_and(|t| t >= now + 599));
}

#[test]
fn a_bulk_load_is_all_or_nothing_and_names_the_bad_entry() {
    let mut maps = FakeMaps::default();
    let mut e = started(&mut maps);
    let mut cidrs: Vec<ipnet::IpNet> = (0..1000).map(|i| format!("198.19.{}.0/24", i % 250).parse().unwrap()).collect();
    cidrs.truncate(250);
    cidrs.push("198.19.250.5/24".parse().unwrap());
    let err = e.load(&mut maps, &cidrs, OverrideAction::Deny, None).unwrap_err();
    assert_eq!(err.to_string(), "entry 250: 198.19.250.5/24 has host bits set (did you mean 198.19.250.0/24?)");
    assert_eq!((maps.applied.len(), maps.runtime.len()), (1, 0), "nothing changed");
    cidrs.pop();
    maps.fail_apply = true;
    assert!(e.load(&mut maps, &cidrs, OverrideAction::Deny, Some(60)).is_err());
    assert_eq!(maps.runtime.len(), 0, "a failed apply takes every record back");
    e.load(&mut maps, &cidrs, OverrideAction::Deny, Some(60)).unwrap();
    assert_eq!((maps.runtime.len(), e.prefixes().len()), (250, 252));
    assert_eq!(maps.applied.last().unwrap().overrides.v4.len(), 252, "one version for all of them");
}

/// A refusal answers with a code the feedback endpoint and the CLI act
/// on: the refused entry of a bulk load, the governor's cap and a higher
/// layer's allow apart from any other refusal.
#[test]
fn a_refusal_answers_with_its_code_and_entry() {
    use crate::control::{ErrorCode, Response};
    use crate::policy::feedback::Refusal;
    let entry = ApplyError::Entry { index: 4, message: "bad".into() };
    assert_eq!(
        entry.answer(7),
        Response::Error { code: ErrorCode::Refused, message: "bad; policy v7 keeps running".into(), entry: Some(4) }
    );
    for (refusal, code) in [
        (Refusal::Cap, ErrorCode::Capped),
        (Refusal::Allowed, ErrorCode::Conflict),
        (Refusal::TooWide, ErrorCode::Refused),
    ] {
        let Response::Error { code: got, message, .. } =
            ApplyError::Governor { refusal, message: "x".into() }.answer(1)
        else {
            panic!()
        };
        assert_eq!(got, code, "{message}");
        assert!(message.starts_with(&format!("governor: {}: x", refusal.label())), "{message}");
    }
}
