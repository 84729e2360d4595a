//! xdp-filter (Debian's xdp-tools) as a peer: loaded by its own tool on a
//! veth in namespaces of the bench's own, one source address denied with
//! `xdp-filter ip -m src`, and run through BPF_PROG_TEST_RUN beside the
//! limiter's programs (the kernel's own timing; same frame, same run).

use std::net::Ipv4Addr;

use aya::programs::{ProgramInfo, TestRun as _, TestRunOptions, Xdp, loaded_programs};
use aya_obj::programs::XdpAttachType;
use limiter_tests::netns::{A_IF, VethPair};

/// xdp-filter loaded and denying one source; unloaded on drop (its
/// namespaces go with it).
pub struct XdpFilter {
    net: VethPair,
    prog: Xdp,
}

impl XdpFilter {
    /// Load xdp-filter on a fresh veth and deny `source`; `None` (said)
    /// when xdp-filter is not installed or will not load.
    pub fn deny(source: Ipv4Addr) -> Option<Self> {
        let net = VethPair::new("xf");
        let xf = |args: &[&str]| {
            let o = net.a.net_command("xdp-filter").args(args).output();
            match o {
                Ok(o) if o.status.success() => Ok(()),
                Ok(o) => Err(String::from_utf8_lossy(&o.stderr).trim().to_owned()),
                Err(e) => Err(format!("xdp-filter: {e} (cargo xtask setup --bench installs xdp-tools)")),
            }
        };
        // Generic mode on a veth: libxdp then attaches the filter program
        // itself, without a dispatcher in front of it.
        let loaded =
            xf(&["load", "-m", "skb", "-f", "ipv4", A_IF]).and_then(|()| xf(&["ip", "-m", "src", &source.to_string()]));
        if let Err(e) = loaded {
            println!("xdp-filter: not measured: {e}");
            return None;
        }
        // The newest of its programs is the one just loaded.
        let Some(info) = loaded_programs().filter_map(Result::ok).filter(is_filter).max_by_key(ProgramInfo::id) else {
            println!("xdp-filter: not measured: its program is not among the loaded ones");
            return None;
        };
        let prog = match Xdp::from_program_info(info, "xdp-filter".into(), XdpAttachType::Interface) {
            Ok(p) => p,
            Err(e) => {
                println!("xdp-filter: not measured: taking its program: {e}");
                return None;
            }
        };
        Some(Self { net, prog })
    }

    /// The action and the kernel's mean ns per run of `repeat` runs.
    pub fn run(&self, frame: &[u8], repeat: u32) -> (u32, f64) {
        let r = self
            .prog
            .test_run(TestRunOptions { data_in: Some(frame), repeat, ..TestRunOptions::new() })
            .expect("BPF_PROG_TEST_RUN of xdp-filter");
        (r.return_value, r.duration.as_secs_f64() * 1e9)
    }
}

fn is_filter(p: &ProgramInfo) -> bool {
    p.name_as_str().is_some_and(|n| n.starts_with("xdpfilt_"))
}

impl Drop for XdpFilter {
    fn drop(&mut self) {
        let _ = self.net.a.net_command("xdp-filter").args(["unload", A_IF]).output();
        // libxdp's lock directory, empty once nothing uses it.
        let _ = std::fs::remove_dir("/sys/fs/bpf/xdp");
    }
}
