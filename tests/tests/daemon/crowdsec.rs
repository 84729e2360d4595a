//! The CrowdSec client against a real Local API (Debian's crowdsec 1.4.6,
//! extracted, with its own database on a private loopback port; see
//! `limiter_tests::crowdsec`): decisions `cscli` adds are read exactly
//! (an address as itself, ranges, IPv6, IPv4-mapped), a pull after
//! `startup` brings only what changed (a deletion included), 10,000
//! imported decisions come in one pull, a wrong key and a LAPI that is
//! down are said as such, and the bouncer shows in `cscli bouncers list`
//! with its last pull.

use std::collections::BTreeSet;

use limiter::crowdsec::{Lapi as Client, LapiError};
use limiter_tests::crowdsec::Lapi;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

fn nets(p: &[limiter::crowdsec::Decision]) -> BTreeSet<String> {
    p.iter().map(|d| d.net.to_string()).collect()
}

#[test]
fn decisions_are_read_exactly_and_then_as_deltas() {
    let _alone = limiter_tests::alone(module_path!());
    let mut lapi = Lapi::start("stream");
    let key = lapi.bouncer_key("limiter-test");
    let client = Client::new(&lapi.url(), &key).unwrap();
    let rt = runtime();
    lapi.cscli(&["decisions", "add", "--ip", "203.0.114.7", "--duration", "4h", "--reason", "test"]);
    lapi.cscli(&["decisions", "add", "--range", "2a00:1450::/32", "--duration", "1h"]);
    lapi.cscli(&["decisions", "add", "--ip", "::ffff:5.6.7.8", "--duration", "1h"]);
    lapi.cscli(&["decisions", "add", "--range", "1.10.16.0/20", "--duration", "30m"]);
    let first = rt.block_on(client.pull(true)).unwrap();
    assert_eq!(
        nets(&first.new),
        BTreeSet::from(["203.0.114.7/32", "2a00:1450::/32", "5.6.7.8/32", "1.10.16.0/20"].map(String::from))
    );
    let ttl = first.new.iter().find(|d| d.net.to_string() == "203.0.114.7/32").unwrap().ttl.as_secs();
    assert!((4 * 3600 - 60..=4 * 3600).contains(&ttl), "{ttl}");
    assert!(first.new.iter().all(|d| d.origin() == "cscli" && d.kind() == "ban"));
    // Nothing changed: an empty delta.
    let none = rt.block_on(client.pull(false)).unwrap();
    assert!(none.new.is_empty() && none.deleted.is_empty(), "{none:?}");
    // A deletion and an addition come as such, and only they.
    lapi.cscli(&["decisions", "delete", "--ip", "203.0.114.7"]);
    lapi.cscli(&["decisions", "add", "--ip", "2001:4860::8888", "--duration", "1h"]);
    let delta = rt.block_on(client.pull(false)).unwrap();
    assert_eq!(nets(&delta.deleted), BTreeSet::from(["203.0.114.7/32".to_owned()]));
    assert_eq!(nets(&delta.new), BTreeSet::from(["2001:4860::8888/128".to_owned()]));
    // The bouncer is listed with its last pull.
    let b = lapi.bouncers();
    let me = b.as_array().unwrap().iter().find(|b| b["name"] == "limiter-test").unwrap();
    assert!(me["last_pull"].as_str().is_some_and(|t| !t.is_empty() && !t.starts_with("0001")), "{me}");
    // It names itself by its User-Agent (`limiter/VERSION`).
    let named = (me["type"].as_str(), me["version"].as_str());
    assert_eq!(named, (Some("limiter"), Some(env!("CARGO_PKG_VERSION"))), "{me}");
    // A wrong key, and a LAPI that is down, are said as such.
    let wrong = Client::new(&lapi.url(), "not-the-key").unwrap();
    assert!(matches!(rt.block_on(wrong.pull(true)), Err(LapiError::Key { status: 403 })));
    lapi.kill();
    let e = rt.block_on(client.pull(false)).unwrap_err();
    assert!(matches!(e, LapiError::Connect { .. }), "{e}");
    // Back: the decisions in force are read again from startup.
    lapi.run();
    let again = rt.block_on(client.pull(true)).unwrap();
    assert_eq!(again.new.len(), 4, "{again:?}");
}

#[test]
fn ten_thousand_imported_decisions_come_in_one_pull() {
    let _alone = limiter_tests::alone(module_path!());
    let lapi = Lapi::start("import");
    let key = lapi.bouncer_key("limiter-bulk");
    // cscli 1.4.6 imports CSV with a header line.
    let list: String = std::iter::once("duration,scope,value\n".to_owned())
        .chain((0..10_000u32).map(|i| format!("2h,ip,{}\n", std::net::Ipv4Addr::from(0x0b00_0000 + i))))
        .collect();
    // Removed with its directory, whatever happens.
    let dir = limiter_tests::kernel::TempDir::new("crowdsec-import");
    let file = dir.0.join("decisions.csv");
    std::fs::write(&file, list).unwrap();
    lapi.cscli(&["decisions", "import", "-i", &file.display().to_string()]);
    let pull = runtime().block_on(Client::new(&lapi.url(), &key).unwrap().pull(true)).unwrap();
    assert_eq!(pull.new.len(), 10_000);
    assert!(pull.new.iter().all(|d| d.net.prefix_len() == 32));
    assert_eq!(nets(&pull.new).len(), 10_000);
}
