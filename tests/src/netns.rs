//! Network namespaces joined by a veth pair, removed on drop (also when a
//! test panics). Both ends live in namespaces made here, addresses come from
//! 198.18.0.0/15, and neither namespace has a default route, so no test
//! packet (nor a reply to a spoofed source) can leave the machine.

use std::{
    process::{Command, Output},
    sync::atomic::{AtomicU32, Ordering},
};

static SEQ: AtomicU32 = AtomicU32::new(0);

fn ip(args: &[&str]) -> Output {
    let out = Command::new("ip").args(args).output().expect("run ip(8) from iproute2");
    assert!(out.status.success(), "ip {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    out
}

/// Join the network namespace `name` (under /run/netns) on this thread
/// only; the rest of the process stays where it is.
pub fn enter(name: &str) {
    use std::os::fd::AsRawFd as _;
    let ns = std::fs::File::open(format!("/run/netns/{name}")).expect("open the namespace");
    // SAFETY: setns on this thread only, with an open netns fd.
    let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
}

/// A named network namespace, deleted on drop.
pub struct NetNs {
    pub name: String,
}

impl NetNs {
    /// A fresh namespace with loopback up.
    #[must_use]
    pub fn new(tag: &str) -> Self {
        let name = format!("lim-{tag}-{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed));
        ip(&["netns", "add", &name]);
        let ns = Self { name };
        ns.ip("link set lo up");
        ns
    }

    /// Run `ip -n NS ARGS` (whitespace-separated), panicking on failure.
    pub fn ip(&self, args: &str) {
        let mut v = vec!["-n", &self.name];
        v.extend(args.split_whitespace());
        ip(&v);
    }

    /// A command that runs `prog` in the namespace's network only, keeping
    /// the host's mounts: `ip netns exec` remounts /sys privately, which
    /// would hide /sys/fs/bpf pins from (and lose them to) the host.
    #[must_use]
    pub fn net_command(&self, prog: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", self.name)).arg("--").arg(prog);
        c
    }

    /// Run `f` on a thread of this process that has joined the namespace's
    /// network (the rest of the process stays where it is). A panic in `f`
    /// carries on in the caller.
    pub fn run_in<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        std::thread::scope(|s| {
            s.spawn(|| {
                enter(&self.name);
                f()
            })
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e))
        })
    }

    /// Spawn `f` on a thread that has joined the namespace's network (a
    /// server that outlives the call, unlike [`NetNs::run_in`]).
    pub fn spawn_in<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> std::thread::JoinHandle<T> {
        let name = self.name.clone();
        std::thread::spawn(move || {
            enter(&name);
            f()
        })
    }

    /// Whether something listens on 127.0.0.1:`port` in the namespace
    /// within 10 s.
    #[must_use]
    pub fn listens_on(&self, port: u16) -> bool {
        self.run_in(|| {
            let start = std::time::Instant::now();
            while start.elapsed() < std::time::Duration::from_secs(10) {
                if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return true;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            false
        })
    }

    /// The namespace's SNMP/netstat counter `name` so far (`nstat`, e.g.
    /// `TcpOutRsts`: the RSTs its kernel sent).
    #[must_use]
    pub fn nstat(&self, name: &str) -> u64 {
        let o = self.command("nstat").args(["-asz", name]).output().expect("nstat runs");
        let text = String::from_utf8_lossy(&o.stdout);
        let line = text.lines().find(|l| l.split_whitespace().next() == Some(name));
        line.and_then(|l| l.split_whitespace().nth(1)?.parse().ok()).unwrap_or_else(|| panic!("nstat {name}: {text}"))
    }

    /// A command that runs `prog` inside the namespace.
    #[must_use]
    pub fn command(&self, prog: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(prog);
        c
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        // Best effort: a failed delete must not turn a passing test red,
        // and panicking in drop during unwinding would abort.
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

/// Sender namespace `a` (interface `va`, 198.18.0.1/24) and receiver
/// namespace `b` (interface `vb`, 198.18.0.2/24), joined by a veth pair
/// with two queues per end so XDP can run on both CPUs.
pub struct VethPair {
    pub a: NetNs,
    pub b: NetNs,
}

pub const A_IF: &str = "va";
pub const B_IF: &str = "vb";
pub const B_ADDR: &str = "198.18.0.2";

impl VethPair {
    #[must_use]
    pub fn new(tag: &str) -> Self {
        let (a, b) = (NetNs::new(&format!("{tag}a")), NetNs::new(&format!("{tag}b")));
        a.ip(&format!(
            "link add {A_IF} numtxqueues 2 numrxqueues 2 type veth peer name {B_IF} netns {} numtxqueues 2 numrxqueues 2",
            b.name
        ));
        a.ip(&format!("addr add 198.18.0.1/24 dev {A_IF}"));
        b.ip(&format!("addr add {B_ADDR}/24 dev {B_IF}"));
        a.ip(&format!("link set {A_IF} up"));
        b.ip(&format!("link set {B_IF} up"));
        // The receiver treats the whole test range as on-link (replies stay
        // on the veth); deliberately no default route anywhere.
        b.ip(&format!("route add 198.18.0.0/15 dev {B_IF}"));
        Self { a, b }
    }

    /// Drop counters of both ends (`ip -s link`), for failure messages: a
    /// conforming packet lost with the sender's TX `dropped` up was lost
    /// to a full veth ring before any XDP program saw it.
    #[must_use]
    pub fn link_counters(&self) -> String {
        [(&self.a, A_IF), (&self.b, B_IF)]
            .iter()
            .map(|(ns, dev)| {
                let o = ns.command("ip").args(["-s", "link", "show", "dev", dev]).output();
                o.map_or_else(|e| format!("{dev}: {e}"), |o| String::from_utf8_lossy(&o.stdout).into_owned())
            })
            .collect()
    }

    /// The MAC address of B's end (where spoofed frames are sent).
    #[must_use]
    pub fn b_mac(&self) -> String {
        let link = std::process::Command::new("ip").args(["-n", &self.b.name, "link", "show", B_IF]).output().unwrap();
        let link = String::from_utf8_lossy(&link.stdout);
        link.split_whitespace().skip_while(|w| *w != "link/ether").nth(1).unwrap().to_owned()
    }

    /// Give the sender one more source address (a /32 on `va`).
    pub fn add_source(&self, addr: &str) {
        self.a.ip(&format!("addr add {addr}/32 dev {A_IF}"));
    }
}
