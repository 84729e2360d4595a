use super::*;

#[test]
fn requests_round_trip_as_one_json_line() {
    let reqs = [
        Request::Status,
        Request::PolicyApply { name: "x.toml".into(), text: Some("rate = 1\n".into()), force: false },
        Request::PrefixSet {
            cidr: "198.18.0.0/16".parse().unwrap(),
            rate: 5,
            burst: 10,
            ttl_secs: Some(600),
            reason: None,
        },
    ];
    for r in reqs {
        let line = serde_json::to_string(&r).unwrap();
        assert!(!line.contains('\n'));
        assert_eq!(serde_json::from_str::<Request>(&line).unwrap(), r);
    }
    assert_eq!(serde_json::to_string(&Request::Stats).unwrap(), r#"{"cmd":"stats"}"#);
    // Struct variants are flattened into the tagged object.
    let a = Response::Applied(Applied { version: 3, summary: "s".into(), upstream: None });
    assert_eq!(serde_json::to_string(&a).unwrap(), r#"{"kind":"applied","version":3,"summary":"s"}"#);
    assert_eq!(serde_json::from_str::<Response>(&serde_json::to_string(&a).unwrap()).unwrap(), a);
    // `prefix deny` without `--upstream` is the line earlier builds sent.
    let deny =
        Request::PrefixDeny { cidr: "198.18.0.0/24".parse().unwrap(), ttl_secs: None, upstream: false, reason: None };
    assert_eq!(
        serde_json::to_string(&deny).unwrap(),
        r#"{"cmd":"prefix_deny","cidr":"198.18.0.0/24","ttl_secs":null}"#
    );
    let up: Request = serde_json::from_str(r#"{"cmd":"prefix_deny","cidr":"198.18.0.0/24","upstream":true}"#).unwrap();
    assert!(matches!(up, Request::PrefixDeny { upstream: true, .. }));
    // A forwarder's backends keep their wire names.
    let f = ForwardInfo { backends: vec![("127.0.0.1:1".into(), true)], backend_failed: 2, ..ForwardInfo::default() };
    let text = serde_json::to_string(&f).unwrap();
    assert!(
        text.contains(r#""upstreams":[["127.0.0.1:1",true]]"#) && text.contains(r#""upstream_failed":2"#),
        "{text}"
    );
}

/// An error carries a code a program acts on (the feedback endpoint's
/// HTTP status, the CLI's line of a bulk load) instead of words to
/// search; an earlier build's answer without one reads as a refusal.
#[test]
fn errors_carry_a_code_and_the_refused_entry() {
    let e = Response::Error { code: ErrorCode::Capped, message: "m".into(), entry: None };
    let line = serde_json::to_string(&e).unwrap();
    assert_eq!(line, r#"{"kind":"error","code":"capped","message":"m"}"#);
    assert_eq!(serde_json::from_str::<Response>(&line).unwrap(), e);
    let old: Response = serde_json::from_str(r#"{"kind":"error","message":"no"}"#).unwrap();
    assert_eq!(old, Response::Error { code: ErrorCode::Refused, message: "no".into(), entry: None });
}

/// A CIDR and a list's action are typed: a request that is not one is
/// refused as a whole when read, never taken for something else (an
/// action other than "deny" used to mean allow).
#[test]
fn a_request_with_no_cidr_or_an_unknown_action_is_not_read() {
    for line in [
        r#"{"cmd":"prefix_deny","cidr":"nonsense"}"#,
        r#"{"cmd":"prefix_set","cidr":"198.18.0.0/33","rate":1,"burst":1}"#,
        r#"{"cmd":"prefix_load","cidrs":["198.18.0.0/24"],"action":"alow"}"#,
        r#"{"cmd":"prefix_load","cidrs":["198.18.0.0/24","x"],"action":"deny"}"#,
    ] {
        assert!(serde_json::from_str::<Request>(line).is_err(), "{line}");
    }
    let ok = r#"{"cmd":"prefix_load","cidrs":["198.18.0.0/24","2001:2::/48"],"action":"deny"}"#;
    let Request::PrefixLoad { cidrs, action, .. } = serde_json::from_str(ok).unwrap() else { panic!() };
    assert_eq!((cidrs.len(), action), (2, Action::Deny));
}
