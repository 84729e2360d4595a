//! A BGP speaker and the transit's router, both real and both from
//! Debian: ExaBGP (the speaker the daemon drives through its command
//! pipes) in one namespace, BIRD 2 (the upstream router, which takes
//! FlowSpec and unicast routes and exports nothing) in another, peering
//! over a veth (198.18.70.1/30 and .2). Each is stopped on drop, and the
//! pipes and files removed.

use std::{
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use crate::{kernel::TempDir, netns::NetNs};

static SEQ: AtomicU32 = AtomicU32::new(0);

const SPEAKER_ADDR: &str = "198.18.70.1";
const ROUTER_ADDR: &str = "198.18.70.2";

/// The speaker's and the router's namespaces, and both daemons.
pub struct Bgp {
    pub speaker_ns: NetNs,
    pub router_ns: NetNs,
    pub dir: TempDir,
    /// The pipes' path without `.in`/`.out` (what `upstream.speaker` names).
    pub pipe: PathBuf,
    exabgp: Option<Child>,
    bird: Option<Child>,
}

fn which(name: &str) -> PathBuf {
    for dir in ["/usr/sbin", "/usr/bin", "/sbin", "/bin"] {
        let p = Path::new(dir).join(name);
        if p.exists() {
            return p;
        }
    }
    panic!("{name} is missing: run `cargo xtask setup` (Debian's exabgp and bird2)");
}

fn mkfifo(p: &Path) {
    let _ = std::fs::remove_file(p);
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo {}", p.display());
}

impl Bgp {
    /// Both namespaces, BIRD started and ExaBGP started; not waiting for
    /// the session ([`Bgp::wait_established`]).
    #[must_use]
    pub fn start(tag: &str) -> Self {
        let (speaker_ns, router_ns) = (NetNs::new(&format!("{tag}s")), NetNs::new(&format!("{tag}r")));
        speaker_ns.ip(&format!("link add bs type veth peer name br netns {}", router_ns.name));
        speaker_ns.ip(&format!("addr add {SPEAKER_ADDR}/30 dev bs"));
        router_ns.ip(&format!("addr add {ROUTER_ADDR}/30 dev br"));
        speaker_ns.ip("link set dev bs up");
        router_ns.ip("link set dev br up");
        let dir = TempDir::new(&format!("bgp-{tag}"));
        // ExaBGP looks for its pipes in /run/exabgp/ (among fixed places).
        std::fs::create_dir_all("/run/exabgp").unwrap();
        let name = format!("limiter-test-{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed));
        let pipe = Path::new("/run/exabgp").join(&name);
        let mut b = Self { speaker_ns, router_ns, dir, pipe, exabgp: None, bird: None };
        b.write_configs();
        b.start_bird();
        b.start_exabgp();
        b
    }

    fn write_configs(&self) {
        let d = &self.dir.0;
        std::fs::write(
            d.join("bird.conf"),
            format!(
                "router id {ROUTER_ADDR};\nflow4 table flowtab4;\nflow6 table flowtab6;\nprotocol device {{}}\n\
                 protocol bgp speaker {{\n  local {ROUTER_ADDR} as 64501;\n  neighbor {SPEAKER_ADDR} as 64500;\n  \
                 hold time 6;\n  ipv4 {{ import all; export none; }};\n  ipv6 {{ import all; export none; }};\n  \
                 flow4 {{ table flowtab4; import all; export none; }};\n  flow6 {{ table flowtab6; import all; export \
                 none; }};\n}}\n"
            ),
        )
        .unwrap();
        std::fs::write(
            d.join("exabgp.conf"),
            format!(
                "neighbor {ROUTER_ADDR} {{\n  router-id {SPEAKER_ADDR};\n  local-address {SPEAKER_ADDR};\n  local-as \
                 64500;\n  peer-as 64501;\n  family {{ ipv4 unicast; ipv6 unicast; ipv4 flow; ipv6 flow; }}\n}}\n"
            ),
        )
        .unwrap();
        std::fs::write(
            d.join("exabgp.env"),
            "[exabgp.api]\ncli = true\nack = true\n[exabgp.daemon]\nuser = 'root'\ndrop = false\ndaemonize = false\n\
             [exabgp.log]\ndestination = 'stdout'\n",
        )
        .unwrap();
    }

    fn start_bird(&mut self) {
        let d = &self.dir.0;
        let child = self
            .router_ns
            .net_command(which("bird"))
            .arg("-f")
            .arg("-c")
            .arg(d.join("bird.conf"))
            .arg("-s")
            .arg(d.join("bird.ctl"))
            .arg("-P")
            .arg(d.join("bird.pid"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start bird");
        self.bird = Some(child);
    }

    /// Start ExaBGP (again): fresh pipes, a fresh process.
    pub fn start_exabgp(&mut self) {
        let name = self.pipe.file_name().unwrap().to_string_lossy().into_owned();
        mkfifo(&self.pipe.with_file_name(format!("{name}.in")));
        mkfifo(&self.pipe.with_file_name(format!("{name}.out")));
        let d = &self.dir.0;
        let log = std::fs::File::create(d.join("exabgp.log")).unwrap();
        let child = self
            .speaker_ns
            .net_command("env")
            .arg(format!("exabgp.api.pipename={name}"))
            .arg(which("exabgp"))
            .arg("--env")
            .arg(d.join("exabgp.env"))
            .arg(d.join("exabgp.conf"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            // A group of its own: its pipe reader (a child) is killed with it.
            .process_group(0)
            .spawn()
            .expect("start exabgp");
        self.exabgp = Some(child);
    }

    /// Kill ExaBGP at once (SIGKILL: no withdrawals, as a crash).
    pub fn kill_exabgp(&mut self) {
        if let Some(mut c) = self.exabgp.take() {
            // Its pipe reader (a child of its own) goes with it.
            if let Ok(pid) = i32::try_from(c.id()) {
                // SAFETY: kill(2) of the group our own child leads.
                unsafe { libc::kill(-pid, libc::SIGKILL) };
            }
            let _ = c.wait();
        }
    }

    /// `birdc` in the router's namespace (its socket is a file: any
    /// namespace reaches it).
    #[must_use]
    pub fn birdc(&self, args: &str) -> String {
        let o = Command::new(which("birdc"))
            .arg("-s")
            .arg(self.dir.0.join("bird.ctl"))
            .args(args.split_whitespace())
            .output()
            .expect("birdc");
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// BIRD's table `flowtab4` or `flowtab6` (`all`: with attributes).
    #[must_use]
    pub fn flows(&self, v6: bool) -> String {
        self.birdc(&format!("show route table flowtab{} all", if v6 { 6 } else { 4 }))
    }

    /// Wait up to `within` for the session to be established.
    #[must_use]
    pub fn wait_established(&self, within: Duration) -> bool {
        self.wait(within, |b| b.birdc("show protocols speaker").contains("Established"))
    }

    /// Poll `ok` every 50 ms for up to `within`: whether it held.
    #[must_use]
    pub fn wait(&self, within: Duration, ok: impl Fn(&Self) -> bool) -> bool {
        let start = Instant::now();
        while start.elapsed() < within {
            if ok(self) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// ExaBGP's log so far (for failure messages).
    #[must_use]
    pub fn exabgp_log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("exabgp.log")).unwrap_or_default()
    }
}

/// The routes of a BIRD table listing (`show route table ... all`): the
/// lines that open a route.
#[must_use]
pub fn routes(listing: &str) -> Vec<String> {
    listing
        .lines()
        .filter(|l| l.starts_with("flow4 {") || l.starts_with("flow6 {") || l.starts_with(|c: char| c.is_ascii_digit()))
        .map(|l| l.split("  [").next().unwrap_or(l).trim().to_owned())
        .collect()
}

impl Drop for Bgp {
    fn drop(&mut self) {
        self.kill_exabgp();
        if let Some(mut c) = self.bird.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let name = self.pipe.file_name().unwrap().to_string_lossy().into_owned();
        for ext in ["in", "out"] {
            let _ = std::fs::remove_file(self.pipe.with_file_name(format!("{name}.{ext}")));
        }
    }
}
