use std::{fmt::Write as _, time::Duration};

use super::*;

#[test]
fn go_durations_read_as_the_lapi_writes_them() {
    let ms = |s: &str| parse_go_duration(s).map(|d| d.as_millis());
    assert_eq!(ms("3h59m58.760265021s"), Some(14_398_760));
    assert_eq!(ms("59m59.76s"), Some(3_599_760));
    assert_eq!(ms("1m30s"), Some(90_000));
    assert_eq!(ms("500ms"), Some(500));
    assert_eq!(ms("0"), Some(0));
    assert_eq!(parse_go_duration("-1.5s"), None, "expired");
    for bad in ["", "5", "3d", "h", "1.2.3s", "9999999999999999999999h"] {
        assert_eq!(parse_go_duration(bad), None, "{bad}");
    }
}

/// What LAPI 1.4.6 answered to `cscli decisions add` of an address, a
/// range and an IPv4-mapped address, then a deletion.
#[test]
fn a_stream_is_typed_exactly() {
    let body = br#"{"deleted":[{"duration":"-2m0.5s","id":4,"origin":"cscli","scenario":"x","scope":"Ip","type":"ban","value":"198.51.100.9"}],"new":[
        {"duration":"59m59.760270049s","id":2,"origin":"cscli","scenario":"manual 'ban'","scope":"Range","type":"ban","value":"2a00:1450::/32"},
        {"duration":"59m59.760265732s","id":3,"origin":"cscli","scenario":"manual","scope":"Ip","type":"ban","value":"::ffff:5.6.7.8"},
        {"duration":"3h59m58.760265021s","id":1,"origin":"lists","scenario":"firehol_cybercrime","scope":"Ip","type":"ban","value":"203.0.114.7"},
        {"duration":"1h","id":5,"origin":"cscli","scenario":"geo","scope":"Country","type":"ban","value":"ZZ"},
        {"duration":"1h","id":6,"origin":"cscli","scenario":"bad","scope":"Ip","type":"ban","value":"not-an-ip"}]}"#;
    let p = decode(body).unwrap();
    let nets: Vec<String> = p.new.iter().map(|d| d.net.to_string()).collect();
    assert_eq!(nets, ["2a00:1450::/32", "5.6.7.8/32", "203.0.114.7/32"], "an address is exactly itself");
    assert_eq!((p.other_scope, p.bad_value), (1, 1));
    assert_eq!(p.new[2].ttl.as_secs(), 14_398);
    assert_eq!(p.new[2].source(), "crowdsec:lists:firehol_cybercrime");
    assert_eq!(p.new[0].source(), "crowdsec:cscli");
    assert_eq!(p.deleted.len(), 1);
    assert_eq!((p.deleted[0].net.to_string().as_str(), p.deleted[0].ttl), ("198.51.100.9/32", Duration::ZERO));
    assert_eq!(decode(br#"{"deleted":null,"new":null}"#).unwrap(), Pull::default());
    assert!(decode(b"<html>").is_err());
}

#[test]
fn only_a_plain_http_lapi_address_and_a_one_line_key_are_taken() {
    assert!(Lapi::new("http://127.0.0.1:8080", "k").is_ok());
    assert!(Lapi::new("http://127.0.0.1:8080/api/", "k").is_ok());
    for url in ["https://lapi:8080", "127.0.0.1:8080", "http://", "http://host", "http://u@h:1"] {
        assert!(Lapi::new(url, "k").is_err(), "{url}");
    }
    assert!(Lapi::new("http://127.0.0.1:8080", "k\r\nX-Evil: 1").is_err());
}

/// Origin and scenario names as a hostile LAPI could send them (M6: a
/// forged `limiter: operator: allowed 0.0.0.0/0` line in `prefix list`
/// and `status`; H6: names past the kernel's 48 bytes): escaped, and
/// short enough that the deny set's origin name holds them whole.
#[test]
fn names_from_the_lapi_are_escaped_and_fit_an_origin_name() {
    let body = br#"{"new":[
        {"duration":"1h","id":1,"origin":"lists","scenario":"x\nlimiter: operator: allowed 0.0.0.0/0\u001b[2J","scope":"Ip","type":"ban","value":"203.0.114.7"},
        {"duration":"1h","id":2,"origin":"lists","scenario":"a_very_long_blocklist_name_that_goes_on_and_on_\u00fc\u00fc\u00fc\u00fc\u00fc","scope":"Ip","type":"ban","value":"203.0.114.8"}]}"#;
    let p = decode(body).unwrap();
    let forged = p.new[0].source();
    assert!(!forged.chars().any(char::is_control), "{forged:?}");
    assert!(forged.starts_with("crowdsec:lists:x\\u{a}limiter: operator"), "{forged}");
    for d in &p.new {
        let s = d.source();
        assert!(s.len() <= limiter_common::deny::ORIGIN_NAME, "{s} is {} bytes", s.len());
    }
    assert!(p.new[1].source().starts_with("crowdsec:lists:a_very_long_blocklist_name"), "{}", p.new[1].source());
}

/// L1 of the third hardening round: unreadable durations were dropped
/// uncounted, `999999999h` was taken as is, and `1ns` bans came and went
/// every second.
#[test]
fn durations_are_read_bounded_and_counted_when_unreadable() {
    let body = br#"{"new":[
        {"duration":"999999999h","id":1,"origin":"cscli","scenario":"x","scope":"Ip","type":"ban","value":"203.0.114.7"},
        {"duration":"1ns","id":2,"origin":"cscli","scenario":"x","scope":"Ip","type":"ban","value":"203.0.114.8"},
        {"duration":"forever","id":3,"origin":"cscli","scenario":"x","scope":"Ip","type":"ban","value":"203.0.114.9"},
        {"duration":"1h","id":4,"origin":"cscli","scenario":"x","scope":"Ip","type":"ban","value":"203.0.114.10"}],
        "deleted":[{"duration":"-1s","id":5,"origin":"cscli","scenario":"x","scope":"Ip","type":"ban","value":"203.0.114.11"}]}"#;
    let p = decode(body).unwrap();
    let ids: Vec<i64> = p.new.iter().map(|d| d.id).collect();
    assert_eq!(ids, [1, 4]);
    assert_eq!(p.new[0].ttl, MAX_TTL, "held at most MAX_TTL");
    assert_eq!(p.bad_duration, 2, "1ns and an unreadable one, counted");
    assert_eq!(p.deleted.len(), 1, "a deletion's negative duration is fine");
}

/// The stream is decoded as it arrives, in whatever chunks
/// the connection gives (here 7 bytes), to what the whole body gives; the
/// names are shared between decisions, not copied per decision.
#[test]
fn a_stream_decoded_in_chunks_is_the_stream_decoded_whole() {
    let mut body = String::from(r#"{"new":["#);
    for i in 0..500 {
        if i > 0 {
            body.push(',');
        }
        write!(
            body,
            r#"{{"duration":"1h","id":{i},"origin":"crowdsec","scenario":"crowdsecurity/ssh-bf","scope":"Ip","type":"ban","value":"198.51.{}.{}"}}"#,
            i / 256,
            i % 256
        )
        .unwrap();
    }
    body.push_str(r#"],"deleted":null,"extra":{"ignored":[1,2,3]}}"#);
    let whole = decode(body.as_bytes()).unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let sent = body.clone();
    let sender = std::thread::spawn(move || {
        for c in sent.as_bytes().chunks(7) {
            tx.blocking_send(Bytes::copy_from_slice(c)).unwrap();
        }
    });
    let chunked = stream::decode_from(stream::Chunks::new(rx)).unwrap();
    sender.join().unwrap();
    assert_eq!(chunked, whole);
    assert_eq!(whole.new.len(), 500);
    assert!(std::sync::Arc::ptr_eq(&whole.new[0].names, &whole.new[499].names), "names are shared");
    // Cut short: an error, not a partial pull.
    assert!(decode(&body.as_bytes()[..body.len() / 2]).is_err());
}

#[test]
fn a_pull_comes_in_parts_deletions_first_and_the_counts_on_the_last() {
    let d = |id: i64| {
        Decision::new(id, "cscli", "s", "ban", format!("198.51.100.{id}/32").parse().unwrap(), Duration::from_mins(1))
    };
    let pull =
        Pull { new: (0..25).map(d).collect(), deleted: (100..103).map(d).collect(), bad_value: 2, ..Pull::default() };
    let parts = Pulled { startup: true, pull, ..Pulled::default() }.parts(10);
    let shape: Vec<(usize, usize, bool, bool, usize)> = parts
        .iter()
        .map(|p| (p.pull.deleted.len(), p.pull.new.len(), p.part.first, p.part.last, p.pull.bad_value))
        .collect();
    assert_eq!(
        shape,
        [(3, 0, true, false, 0), (0, 10, false, false, 0), (0, 10, false, false, 0), (0, 5, false, true, 2)]
    );
    let ids: Vec<i64> = parts.iter().flat_map(|p| p.pull.new.iter().map(|d| d.id)).collect();
    assert_eq!(ids, (0..25).collect::<Vec<_>>(), "in order");
    assert!(parts.iter().all(|p| p.startup));
    let empty = Pulled::default().parts(10);
    assert_eq!((empty.len(), empty[0].part), (1, Part::default()));
}

#[test]
fn a_pulls_room_is_free_again_only_when_its_last_part_is_gone() {
    let rooms = std::sync::Arc::new(tokio::sync::Semaphore::new(1));
    let room = std::sync::Arc::clone(&rooms).try_acquire_owned().unwrap();
    let d = |id: i64| {
        Decision::new(id, "cscli", "s", "ban", format!("198.51.100.{id}/32").parse().unwrap(), Duration::from_mins(1))
    };
    let pull = Pull { new: (0..25).map(d).collect(), ..Pull::default() };
    let mut parts =
        Pulled { startup: false, pull, room: Some(std::sync::Arc::new(room)), ..Pulled::default() }.parts(10);
    assert_eq!(parts.len(), 3);
    assert_eq!(rooms.available_permits(), 0, "held while parts wait");
    parts.truncate(1);
    assert_eq!(rooms.available_permits(), 0, "held by the part still waiting");
    drop(parts);
    assert_eq!(rooms.available_permits(), 1, "free once every part is gone");
}
