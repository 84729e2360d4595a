//! `kind = "ipset"` through the daemon, over a real veth: the members of
//! an `ipset save` (ipset v7.17's own lines) are denied at XDP while the
//! rest passes, and a save with a `nomatch` member is refused with its
//! line and the last version stays.

use std::time::Duration;

use limiter_tests::{
    kernel::{TempDir, require_root},
    netns::{B_IF, VethPair},
    scenario::{self, CONFORM_SRC, FLOOD_SRC, delivered, spawn_lines, unique_socket, wait_for},
};

const SAVED: &str = "\
create blocked hash:net family inet hashsize 1024 maxelem 65536 timeout 0 comment bucketsize 12 initval 0xe6ad0e59
add blocked 198.18.1.0/24 timeout 0 comment \"scanner\"
create probes hash:ip family inet hashsize 1024 maxelem 65536 bucketsize 12 initval 0xf51034c6
add probes 203.0.113.7
";

#[test]
fn the_members_of_an_ipset_save_are_denied_and_a_nomatch_is_refused() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let tmp = TempDir::new("source-ipset");
    let (saved, file) = (tmp.0.join("blocked.ipset"), tmp.0.join("policy.toml"));
    std::fs::write(&saved, SAVED).unwrap();
    let policy = format!(
        "rate = 100000\nburst = 100000\n\n[[source]]\nname = \"blocked\"\nkind = \"ipset\"\naction = \"deny\"\npath = \"{}\"\n",
        saved.display()
    );
    std::fs::write(&file, policy).unwrap();
    let socket = unique_socket("source-ipset");
    let net = VethPair::new("si");
    for src in [FLOOD_SRC, CONFORM_SRC] {
        net.add_source(src);
    }
    let mut c = net.b.command(scenario::locate_bin("limiter").unwrap());
    c.args(["run", "--iface", B_IF, "--status-interval", "0", "--policy"]).arg(&file).arg("--socket").arg(&socket);
    let (_daemon, rx) = spawn_lines(c).unwrap();
    let mut log = String::new();
    wait_for(&rx, "attached", scenario::DAEMON_START, &mut log).unwrap();
    assert!(log.contains("source blocked: 2 networks read at start"), "{log}");
    assert_eq!(delivered(&net, FLOOD_SRC, 50), 0, "a member of the saved set passed");
    assert_eq!(delivered(&net, CONFORM_SRC, 50), 50);

    // A save with an exception: refused with its line; the last stays.
    std::fs::write(&saved, format!("{SAVED}add blocked 198.18.1.0/28 nomatch\n")).unwrap();
    wait_for(&rx, "line 5: 198.18.1.0/28 is a nomatch exception", Duration::from_secs(10), &mut log).unwrap();
    assert_eq!(delivered(&net, FLOOD_SRC, 50), 0, "a refused save lifted the deny");
}
