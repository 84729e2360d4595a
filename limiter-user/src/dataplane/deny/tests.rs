use limiter_common::deny::OWNER;

use super::*;

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn value_of(ch: &DenyWrites, n: &str) -> Option<u32> {
    let k = key_of(&net(n));
    ch.upserts.iter().find(|(u, _)| *u == k).map(|(_, v)| *v)
}

#[test]
fn keys_and_networks_are_one_another() {
    for n in ["198.18.5.0/24", "198.18.5.7/32", "0.0.0.0/0", "2001:2::/48", "2001:2:0:1::9/128"] {
        assert_eq!(net_of(&key_of(&net(n))), net(n), "{n}");
    }
    // A key is its network masked: host bits do not make another key.
    assert_eq!(key_of(&"198.18.5.9/24".parse().unwrap()), key_of(&net("198.18.5.0/24")));
}

#[test]
fn a_finer_network_leaves_a_marker_under_its_bucket() {
    let mut s = DenySet::new(100, 24, 64);
    let o = s.origin("feed:a").unwrap();
    s.add(o, &net("198.18.5.7/32")).unwrap();
    s.add(o, &net("198.18.0.0/16")).unwrap();
    let ch = s.finish();
    assert_eq!(value_of(&ch, "198.18.5.7/32"), Some(DENIED | u32::from(o.0)));
    assert_eq!(value_of(&ch, "198.18.5.0/24"), Some(FINER), "the /24 bucket's marker");
    assert_eq!(value_of(&ch, "198.18.0.0/16"), Some(DENIED | u32::from(o.0)), "no marker: not finer");
    assert_eq!(ch.upserts.len(), 3);
    let lens = ch.lens_during.expect("lengths grow first");
    assert_eq!(lens.v4[..3], [32, 16, limiter_common::deny::END]);
    assert_eq!(ch.lens_after, None);
}

#[test]
fn a_network_two_origins_deny_stays_until_both_lift_it() {
    let mut s = DenySet::new(100, 24, 64);
    let (a, b) = (s.origin("crowdsec:cscli").unwrap(), s.origin("feed:drop").unwrap());
    s.add(a, &net("2001:2::1/128")).unwrap();
    s.add(b, &net("2001:2::1/128")).unwrap();
    s.finish();
    s.remove(a, &net("2001:2::1/128"));
    let ch = s.finish();
    let b_index = u8::try_from(b.0).unwrap();
    assert_eq!(ch.deletes, vec![owner_key(&key_of(&net("2001:2::1/128")), b_index)], "b's owner record");
    assert_eq!(value_of(&ch, "2001:2::1/128"), Some(DENIED | u32::from(b.0)), "b's now");
    assert_eq!(s.origins_of(&net("2001:2::1/128")), vec![b]);
    s.remove(a, &net("2001:2::1/128"));
    assert!(s.finish().is_empty(), "a lifts only what it denied");
    s.remove(b, &net("2001:2::1/128"));
    let ch = s.finish();
    let mut gone = ch.deletes.clone();
    gone.sort_by_key(|k| k.len);
    assert_eq!(gone, vec![key_of(&net("2001:2::/64")), key_of(&net("2001:2::1/128"))], "the net and its marker");
    assert_eq!(ch.lens_during, None);
    assert_eq!(ch.lens_after.expect("lengths shrink last").v6[0], limiter_common::deny::END);
    assert!(s.is_empty());
}

#[test]
fn a_replacement_moves_only_what_changed() {
    let mut s = DenySet::new(100, 24, 64);
    let o = s.origin("feed:x").unwrap();
    let set = |v: &[&str]| v.iter().map(|n| net(n)).collect::<HashSet<_>>();
    s.replace(o, &set(&["198.18.1.0/24", "198.18.2.0/24", "198.18.3.0/24"])).unwrap();
    s.finish();
    s.replace(o, &set(&["198.18.2.0/24", "198.18.3.0/24", "198.18.4.0/24"])).unwrap();
    let ch = s.finish();
    assert_eq!(ch.upserts, vec![(key_of(&net("198.18.4.0/24")), DENIED | u32::from(o.0))]);
    assert_eq!(ch.deletes, vec![key_of(&net("198.18.1.0/24"))]);
    assert_eq!(s.count_of(o), 3);
}

#[test]
fn the_set_is_bounded() {
    // Kernel entries are bounded, markers with the networks (a million
    // /32s each in its own /24 take two million entries: counted as a
    // million, the kernel would refuse the rest).
    let mut s = DenySet::new(5, 24, 64);
    let o = s.origin("x").unwrap();
    s.add(o, &net("198.18.1.1/32")).unwrap();
    s.add(o, &net("198.18.1.2/32")).unwrap();
    s.add(o, &net("198.18.2.1/32")).unwrap();
    assert_eq!(s.add(o, &net("198.18.3.1/32")), Err(DenyError::Full(5)), "a network and its marker: 7 entries");
    assert_eq!(s.add(o, &net("198.18.1.3/32")), Err(DenyError::Full(5)), "6 entries");
    s.remove(o, &net("198.18.1.2/32"));
    assert_eq!(s.add(o, &net("198.18.1.3/32")), Ok(()), "its marker is there: one entry");
    let mut s = DenySet::new(1000, 24, 64);
    for len in 0..limiter_common::deny::MAX_LENS {
        let len = u8::try_from(len + 60).unwrap();
        s.add(o, &IpNet::new("2001:2::".parse().unwrap(), len).unwrap()).unwrap();
    }
    assert!(matches!(s.add(o, &net("2001:2::/48")), Err(DenyError::TooManyLengths(_))));
    // Every index held by an origin that denies something: no room. One
    // that denies nothing any more gives its index to the next (else
    // origins that come and go would use the indexes up for good).
    let mut s = DenySet::new(1000, 24, 64);
    let held: Vec<(OriginId, IpNet)> = (0..MAX_NAMED)
        .map(|i| {
            let o = s.origin(&format!("o{i}")).unwrap();
            let n = net(&format!("198.18.{i}.1/32"));
            s.add(o, &n).unwrap();
            (o, n)
        })
        .collect();
    assert_eq!(s.origin("one more"), Err(DenyError::TooManyOrigins));
    let (o, n) = held[7];
    s.remove(o, &n);
    assert_eq!(s.origin("one more"), Ok(o));
    assert_eq!(s.names()[usize::from(o.0)], "one more");
    assert_eq!(s.count_named("o7"), 0);
}

#[test]
fn markers_follow_the_bucket_prefix() {
    let mut s = DenySet::new(100, 24, 64);
    let o = s.origin("x").unwrap();
    s.add(o, &net("198.18.5.7/32")).unwrap();
    s.finish();
    let (first, second) = s.set_bucket(16, 64);
    assert_eq!(first.upserts, vec![(key_of(&net("198.18.0.0/16")), FINER)], "the new marker before the switch");
    assert!(first.deletes.is_empty());
    assert_eq!(second.deletes, vec![key_of(&net("198.18.5.0/24"))], "the old one after");
    assert!(second.upserts.is_empty());
}

#[test]
fn a_restart_reads_the_set_back_and_mends_a_cut_write() {
    let mut s = DenySet::new(100, 24, 64);
    let (a, b) = (s.origin("feed:a").unwrap(), s.origin("crowdsec:cscli").unwrap());
    s.add(a, &net("198.18.5.7/32")).unwrap();
    s.add(b, &net("2001:2::/48")).unwrap();
    let ch = s.finish();
    // As pinned, but a write cut short left the /32 without its marker.
    let entries: Vec<_> = ch.upserts.iter().copied().filter(|(k, _)| k.len != 24).collect();
    let pinned = Pinned { entries, names: s.names().to_vec(), lens: ch.lens_during.unwrap() };
    let (r, mend) = DenySet::restore(100, (24, 64), pinned);
    assert_eq!(r.len(), 2);
    assert_eq!(r.origins_of(&net("2001:2::/48")), vec![b]);
    assert_eq!(r.names(), s.names());
    assert_eq!(mend.upserts, vec![(key_of(&net("198.18.5.0/24")), FINER)], "the missing marker");
    assert!(mend.deletes.is_empty() && mend.lens_during.is_none() && mend.lens_after.is_none());
}

/// Were the pins to keep one origin per network (the lowest, in its
/// value), a restarted daemon would think a network two feeds list the
/// first one's alone: the first's next version would lift it (until the
/// second's was read), and the second's shrink guard would count too
/// few. Owner records keep every origin; a record whose network is
/// gone is mended away.
#[test]
fn every_origin_of_a_network_survives_a_restart() {
    let mut kernel: HashMap<DenyKey, u32> = HashMap::new();
    let write = |kernel: &mut HashMap<DenyKey, u32>, ch: DenyWrites| {
        kernel.extend(ch.upserts);
        for k in ch.deletes {
            kernel.remove(&k);
        }
    };
    let mut set = DenySet::new(100, 24, 64);
    let (a, b, c) = (set.origin("feed:a").unwrap(), set.origin("feed:b").unwrap(), set.origin("feed:c").unwrap());
    for o in [a, b, c] {
        set.add(o, &net("198.18.5.7/32")).unwrap();
    }
    set.add(b, &net("198.18.6.0/24")).unwrap();
    write(&mut kernel, set.finish());
    assert_eq!(kernel.len(), 5, "two networks, a marker, two owner records");
    // A stray record of a network no longer there (a cut write).
    kernel.insert(owner_key(&key_of(&net("198.18.9.9/32")), 2), OWNER | 2);
    let pinned = || Pinned {
        entries: kernel.iter().map(|(k, v)| (*k, *v)).collect(),
        names: set.names().to_vec(),
        lens: DenyLens::default(),
    };
    let (mut back, mend) = DenySet::restore(100, (24, 64), pinned());
    assert_eq!(back.origins_of(&net("198.18.5.7/32")), vec![a, b, c]);
    assert_eq!((back.count_of(a), back.count_of(b), back.count_of(c)), (1, 2, 1));
    assert_eq!(mend.deletes, vec![owner_key(&key_of(&net("198.18.9.9/32")), 2)]);
    write(&mut kernel, mend);
    // a lifts it: b and c still deny it, in the kernel too.
    back.remove(a, &net("198.18.5.7/32"));
    let ch = back.finish();
    assert!(ch.deletes.iter().all(|k| k.pad[0] == OWNER_KEY), "{ch:?}");
    write(&mut kernel, ch);
    assert_eq!(kernel[&key_of(&net("198.18.5.7/32"))], DENIED | u32::from(b.0));
    // Room counts the owner records.
    let mut full = DenySet::new(2, 24, 64);
    let (first, second) = (full.origin("x").unwrap(), full.origin("y").unwrap());
    full.add(first, &net("198.18.0.0/16")).unwrap();
    full.add(second, &net("198.18.0.0/16")).unwrap();
    assert_eq!(full.add(first, &net("198.19.0.0/16")), Err(DenyError::Full(2)));
}
