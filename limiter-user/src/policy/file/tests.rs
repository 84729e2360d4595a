use super::*;
use crate::policy::{Override, OverrideAction};

const GOOD: &str = r#"
mode = "enforce"
rate = 500
burst = 1000
v6_prefix = 48

[[class]]
name = "https-syn"
protocol = "tcp"
ports = [443, "8000-8080"]
syn = true
rate = 20
burst = 40
mode = "shadow"

[[class]]
name = "quic"
protocol = "udp"
ports = [443]
rate = 2000
burst = 4000
"#;

fn load(text: &str) -> Result<Loaded, PolicyError> {
    parse("p.toml", text.to_owned())
}

/// Parse and compile, as `limiter policy check` does.
fn err(text: &str) -> PolicyError {
    match load(text) {
        Ok(l) => l.check().unwrap_err(),
        Err(e) => e,
    }
}

#[test]
fn a_full_policy_parses() {
    let p = load(GOOD).unwrap().policy;
    assert_eq!((p.default.rate, p.default.burst, p.v6_prefix, p.v4_prefix), (500, 1000, 48, 24));
    assert_eq!(p.classes.len(), 2);
    assert_eq!(p.classes[0].ports, vec![(443, 443), (8000, 8080)]);
    assert_eq!((p.classes[0].syn, p.classes[0].limit.mode), (true, Mode::Shadow));
    assert_eq!((p.classes[1].protocol, p.classes[1].limit.mode), (Protocol::Udp, Mode::Enforce));
}

#[test]
fn errors_name_file_line_and_field() {
    let cases = [
        ("rate = 10\nbursty = 3\n", 2, "bursty", "unknown field"),
        ("rate = \"fast\"\n", 1, "rate", "invalid type"),
        ("rate = -5\n", 1, "rate", ""),
        ("mode = \"loud\"\n", 1, "mode", "enforce"),
        ("rate = 0\n", 1, "rate", "outside"),
        ("v4_prefix = 40\n", 1, "v4_prefix", "longer than 32"),
        ("capacity = 4294967295\n", 1, "capacity", "outside"),
        ("[[class]]\nname = \"a\"\nrate = 1\nburst = 1\nprotocol = \"sctp\"\n", 5, "class[0].protocol", "one of"),
        ("[[class]]\nname = \"a\"\nrate = 1\nburst = 1\nsyn = true\n", 5, "class[0].syn", "tcp"),
        (
            "[[class]]\nname = \"a\"\nrate = 1\nburst = 1\n[[class]]\nname = \"b\"\nrate = 0\nburst = 1\n",
            7,
            "class[1].rate",
            "outside",
        ),
        (
            "[[class]]\nname = \"a\"\nprotocol = \"udp\"\nports = [\"9-3\"]\nrate = 1\nburst = 1\n",
            4,
            "class[0].ports",
            "range",
        ),
        (
            "[[class]]\nname = \"a\"\nprotocol = \"udp\"\nports = [65536]\nrate = 1\nburst = 1\n",
            4,
            "class[0].ports",
            "65536 is not a port (1..=65535)",
        ),
        ("[[class]]\nname = \"a\"\nrate = 1\nburst = 1\ncolour = 1\n", 5, "class[0].colour", "unknown field"),
        ("[[override]]\ncidr = \"198.18.5.7/24\"\naction = \"allow\"\n", 2, "override[0].cidr", "host bits"),
        (
            "[[override]]\ncidr = \"198.18.5.0/24\"\naction = \"allow\"\n[[override]]\ncidr = \"nonsense\"\naction = \"deny\"\n",
            5,
            "override[1].cidr",
            "invalid",
        ),
        ("[[override]]\ncidr = \"198.18.5.0/24\"\naction = \"maybe\"\n", 3, "override[0].action", "allow"),
        ("[[override]]\ncidr = \"198.18.5.0/24\"\nrate = 5\n", 1, "override[0].action", "both rate and burst"),
        ("[[override]]\ncidr = \"198.18.5.0/25\"\naction = \"deny\"\n", 2, "override[0].cidr", "bucket prefix"),
        (
            "[[override]]\ncidr = \"198.18.5.0/24\"\naction = \"deny\"\n[[override]]\ncidr = \"198.18.5.0/24\"\naction = \"allow\"\n",
            5,
            "override[1].cidr",
            "twice",
        ),
        ("new_source_rate = 5\n", 1, "new_source_burst", "needs"),
        // The top-level settings are flattened into the model (they are
        // `limiter run`'s flags too): their errors are still placed.
        ("mode = \"enforce\"\n\nrate = \"fast\"\n", 3, "rate", "invalid type"),
        ("mode = \"enforce\"\n\ncapacity = -1\n", 3, "capacity", ""),
        ("mode = \"enforce\"\nrate = 5\nbursty = 3\n", 3, "bursty", "did you mean `burst`?"),
        // Nothing near: every key it takes.
        ("mode = \"enforce\"\nrate = 5\nzzzzzz = 3\n", 3, "zzzzzz", "expected one of `allow_empty`"),
        ("[[class]]\nname = \"q\"\nrat = 5\n", 3, "class[0].rat", "did you mean `rate`?"),
        ("rate = 5\nnew_source_rate = 5\n", 2, "new_source_burst", "new_source_rate needs new_source_burst"),
        ("rate = 5\n\naggregate_burst = 5\n", 3, "aggregate_rate", "aggregate_burst needs aggregate_rate"),
        ("rate = 5\naggregate_v6_prefix = 40\n", 2, "aggregate_rate", "need"),
        ("[[class]]\nname = \"q\"\nwindow = \"60s\"\n", 1, "class[0].limit", "needs limit"),
        (
            "[[class]]\nname = \"q\"\nwindow = \"60s\"\nlimit = 600\nrate = 5\n",
            1,
            "class[0].rate",
            "not rate and burst",
        ),
        (
            "[[class]]\nname = \"q\"\nwindow = \"60s\"\nlimit = 600\nslices = 20\n",
            5,
            "class[0].slices",
            "outside 2..=12",
        ),
        ("[[class]]\nname = \"q\"\nwindow = \"7s\"\nlimit = 600\n", 3, "class[0].window", "whole nanoseconds"),
        ("[[class]]\nname = \"q\"\nlimit = 600\n", 1, "class[0].limit", "belongs to a window quota"),
        ("[[class]]\nname = \"q\"\n", 1, "class[0].rate", "give rate and burst"),
        (
            "[[class]]\nname = \"q\"\nwindow = \"6s\"\nlimit = 6\non_store_failure = \"split\"\n",
            1,
            "class[0].on_store_failure",
            "fleet",
        ),
        ("[[class]]\nname = \"q\"\nwindow = \"6s\"\nlimit = 6\nscope = \"galaxy\"\n", 5, "class[0].scope", "local"),
        ("[[override]]\ncidr = \"198.18.5.0/24\"\nwindow = \"1m\"\nlimit = 0\n", 4, "override[0].limit", "outside"),
        ("aggregate_v4_prefix = 12\n", 1, "aggregate_rate", "need"),
        (
            "v4_prefix = 16\naggregate_rate = 1\naggregate_burst = 1\naggregate_v4_prefix = 20\n",
            4,
            "aggregate_v4_prefix",
            "finer",
        ),
    ];
    for (text, line, field, problem) in cases {
        let e = err(text);
        assert_eq!(e.location, Some(("p.toml".into(), line)), "{text:?}: {e}");
        assert_eq!(e.field, field, "{text:?}: {e}");
        assert!(e.problem.contains(problem), "{text:?}: {e}");
        assert!(e.to_string().starts_with(&format!("p.toml:{line}: {field}: ")), "{e}");
    }
}

/// Every section says what it does with one word ([`Action`]) and takes
/// only its own: each other word is refused at the section's `action`,
/// naming the ones it takes.
#[test]
fn each_section_takes_only_its_own_actions() {
    use crate::policy::Action;
    let over = "[[override]]\ncidr = \"198.18.5.0/24\"\n";
    let all = [Action::Limit, Action::Rate, Action::Allow, Action::Deny, Action::Unset];
    let sections: [(&str, &str, &[Action]); 3] = [
        (over, "override[0].action", &[Action::Allow, Action::Deny]),
        ("[[feed]]\nname = \"f\"\npath = \"/f\"\n", "feed[0].action", &[Action::Deny]),
        (
            "[[group]]\nname = \"g\"\npath = \"/g\"\ncountries = [\"DE\"]\n",
            "group[0].action",
            &[Action::Rate, Action::Allow, Action::Deny],
        ),
    ];
    for (section, field, takes) in sections {
        for a in all {
            let text = format!("{section}action = \"{a}\"\n");
            let r = load(&text).and_then(|l| l.check().map(drop));
            if takes.contains(&a) {
                // Refused only for what the file lacks (a rate group's rate).
                assert!(
                    r.as_ref().is_ok_and(|()| true) || r.as_ref().is_err_and(|e| e.field != field),
                    "{text:?}: {r:?}"
                );
            } else {
                let Err(e) = r else { panic!("{text:?} taken") };
                assert_eq!(e.field, field, "{text:?}: {e}");
                assert!(e.problem.contains(&format!("\"{a}\"")), "{text:?}: {e}");
                assert!(takes.iter().all(|t| e.problem.contains(&format!("\"{t}\""))), "{text:?}: {e}");
            }
        }
    }
    let Ok(l) = load(&format!("{over}action = \"deny\"\n")) else { panic!("an override's deny") };
    assert_eq!(l.policy.overrides[0].action, OverrideAction::Deny);
}

#[test]
fn an_error_in_a_policy_with_runtime_overrides_points_at_the_file_or_says_run_time() {
    let text = "[[override]]\ncidr = \"198.18.1.0/24\"\naction = \"deny\"\n\n[[override]]\ncidr = \"198.18.9.0/24\"\nrate = 0\nburst = 5\n";
    let l = load(text).unwrap();
    // At run time the first file override was removed: the bad one is now
    // override[0] of the applied policy, but it is the file's override[1].
    let mut applied = l.policy.clone();
    applied.overrides.remove(0);
    let e = l.provenance.locate(applied.compile(1).unwrap_err(), &applied);
    assert_eq!((e.field.as_str(), e.location.clone()), ("override[1].rate", Some(("p.toml".into(), 7))), "{e}");
    // One added at run time is said to be so.
    let mut applied = l.policy.clone();
    applied.overrides[1] =
        Override { net: "198.18.77.0/25".parse().unwrap(), action: OverrideAction::Deny, criticality: None };
    let e = l.provenance.locate(applied.compile(1).unwrap_err(), &applied);
    assert!(e.problem.contains("198.18.77.0/25 was set at run time"), "{e}");
}

#[test]
fn locating_the_last_of_many_overrides_is_linear() {
    use std::fmt::Write as _;
    // The error of the last of `n` overrides, located, and how long it
    // took.
    let locate = |n: u32| {
        let mut text = String::new();
        for i in 0..n - 1 {
            let [_, a, b, c] = i.to_be_bytes();
            let _ = write!(text, "[[override]]\ncidr = \"{}.{b}.{c}.0/24\"\naction = \"deny\"\n", 100 + a);
        }
        text.push_str("[[override]]\ncidr = \"100.0.0.0/24\"\naction = \"deny\"\n");
        let start = std::time::Instant::now();
        let e = err(&text);
        let took = start.elapsed();
        assert_eq!(e.field, format!("override[{}].cidr", n - 1), "{e}");
        assert_eq!(e.location.map(|l| l.1), Some(n as usize * 3 - 1));
        took
    };
    // 8x the overrides: linear takes about 8x as long, quadratic 64x
    // (minutes here); a ratio, as the machine's speed is not ours, each
    // side the quickest of its runs (interleaved: a burst of load from
    // the other tests on this machine slows one run, not all).
    let (mut small, mut large) = (std::time::Duration::MAX, std::time::Duration::MAX);
    for _ in 0..2 {
        small = small.min(locate(16_384)).min(locate(16_384));
        large = large.min(locate(131_072));
    }
    let ratio = large.as_secs_f64() / small.as_secs_f64().max(1e-3);
    assert!(ratio < 24.0, "8x the overrides took {ratio:.1}x as long ({small:?}, then {large:?})");
}

#[test]
fn a_file_that_sets_nothing_is_refused_unless_it_says_so() {
    for text in ["", "# just a comment\n\n", "   \n"] {
        let e = load(text).unwrap_err();
        assert_eq!(e.field, "(document)", "{text:?}");
        assert!(e.problem.contains("allow_empty = true"), "{e}");
    }
    assert_eq!(load("allow_empty = true\n").unwrap().policy, Policy::default());
}

#[test]
fn policies_that_cover_everything_are_warned_about() {
    let p = load("v4_prefix = 0\n[[override]]\ncidr = \"::/0\"\naction = \"deny\"\n").unwrap().policy;
    let w = p.warnings();
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(w[0].contains("every IPv4 source shares one bucket"), "{w:?}");
    assert!(w[1].contains("override[0] denies every IPv6 source"), "{w:?}");
    assert!(Policy::default().warnings().is_empty());
}

#[test]
fn the_new_source_budget_is_on_by_default_and_zero_turns_it_off() {
    let d = load("allow_empty = true\n").unwrap().policy;
    assert_eq!(d.new_sources, Some(super::super::DEFAULT_NEW_SOURCES));
    let off = load("new_source_rate = 0\n").unwrap().policy;
    assert_eq!(off.new_sources, None);
    // Rendered, an unlimited budget reads back as unlimited.
    assert_eq!(load(&render(&off)).unwrap().policy.new_sources, None);
}

#[test]
fn render_reads_back_to_the_same_policy() {
    let mut text = GOOD.to_owned();
    text =
        format!("new_source_rate = 500\nnew_source_burst = 900\naggregate_rate = 4000\naggregate_burst = 8000\n{text}");
    text.push_str("\n[[override]]\ncidr = \"198.18.0.0/16\"\nrate = 5\nburst = 9\n\n[[override]]\ncidr = \"2001:2::/48\"\naction = \"deny\"\n\n[[class]]\nname = \"ping\"\nprotocol = \"icmp\"\nrate = 3\nburst = 3\n");
    text.push_str("\n[[class]]\nname = \"syn-quota\"\nprotocol = \"tcp\"\nports = [443]\nsyn = true\nlimit = 600\nwindow = \"60s\"\nscope = \"fleet\"\non_store_failure = \"split\"\nsyn_cookies = \"auto\"\nsyn_rate = 3000\n");
    text.push_str("\n[[override]]\ncidr = \"198.19.0.0/16\"\nlimit = 50\nwindow = \"6s\"\nslices = 3\n");
    text.push_str("\n[[forward]]\nlisten = [\"198.18.0.2:443\"]\nupstreams = [\"127.0.0.1:8443\"]\ncopy = \"buffer\"\nproxy_protocol = \"v1\"\n");
    text.push_str("\n[fleet]\nstore = [\"redis://198.19.0.1:7001\", \"redis://198.19.0.1:7002\"]\nnode = \"edge-1\"\nnodes = 3\nsync_interval = \"250ms\"\n");
    text.push_str("\n[feedback]\nlisten = \"127.0.0.1:9465\"\ntoken_file = \"/etc/limiter/token\"\nmax_ttl = \"1h\"\n\n[feedback.escalate]\ndrops_per_sec = 2000\nsustained = \"1500ms\"\ndeny_for = \"10m\"\n");
    let p = load(&text).unwrap().policy;
    assert_eq!(p.forwards[0].copy, crate::policy::forward::Copy::Buffer);
    assert_eq!(p.feedback.as_ref().and_then(|f| f.escalate).map(|e| e.drops_per_sec), Some(2000));
    assert_eq!(p.overrides.len(), 3);
    let w = p.classes[3].limit.window.unwrap();
    assert_eq!((w.limit, w.length.as_secs(), w.slices, w.scope), (600, 60, 12, crate::policy::Scope::Fleet));
    assert_eq!(w.on_store_failure, crate::policy::StoreFailure::Split);
    assert_eq!((p.classes[3].syn_cookies, p.classes[3].syn_rate), (crate::policy::SynCookies::Auto, Some(3000)));
    let f = p.fleet.as_ref().unwrap();
    assert_eq!((f.node.as_str(), f.nodes, f.sync_interval.as_millis(), f.is_cluster()), ("edge-1", 3, 250, true));
    assert_eq!(p.new_sources, Some((500, 900)));
    assert_eq!(p.aggregate.map(|a| (a.rate, a.v4_prefix, a.v6_prefix)), Some((4000, 16, 40)));
    let again = parse("rendered", render(&p)).unwrap().policy;
    assert_eq!(again, p);
    assert_eq!(again.classes[2].protocol, Protocol::Icmp);
}

#[test]
fn only_regular_files_of_bounded_size_are_read() {
    let e = read(Path::new("/nonexistent/limiter.toml")).unwrap_err();
    assert!(e.to_string().starts_with("/nonexistent/limiter.toml:"), "{e}");
    let e = read(Path::new("/dev/zero")).unwrap_err();
    assert!(e.problem.contains("not a regular file"), "{e}");
    let e = read(Path::new("/tmp")).unwrap_err();
    assert!(e.problem.contains("not a regular file"), "{e}");
}

/// Each of the file's own top-level keys is one the parser knows (the
/// message of an unknown key lists them, and the knobs'), and the list
/// names every key once.
#[test]
fn an_unknown_keys_message_lists_exactly_the_keys_the_parser_takes() {
    let e = err("colour = 1\n");
    let listed: Vec<&str> = e.problem.split_once("expected one of ").unwrap().1.split(", ").collect();
    for key in &listed {
        let key = key.trim_matches('`');
        let e = err(&format!("{key} = \"?\"\n"));
        assert!(!e.problem.contains("unknown field"), "{key}: {e}");
    }
    let mut unique = listed.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), listed.len(), "{listed:?}");
    assert!(listed.contains(&"`rate`") && listed.contains(&"`fleet`"), "{listed:?}");
}
