//! Sharing the interface with libxdp's dispatcher: the interface's
//! programs as Debian's xdp-loader lists them, xdp-filter as the
//! neighbour, and libxdp's lock directory on the host's bpffs.

use crate::netns::{B_IF, VethPair};

/// libxdp's lock directory on the host's bpffs, which xdp-loader and the
/// daemon's `libxdp` mode make when they first need it.
pub const LIBXDP_DIR: &str = "/sys/fs/bpf/xdp";

/// (tests running, whether the directory was there before the first).
static LIBXDP_USERS: std::sync::Mutex<(usize, bool)> = std::sync::Mutex::new((0, false));

/// Held by each test: the last one to end removes libxdp's directory
/// when the tests made it (it stays empty once the programs are gone).
pub struct LibxdpDir;

impl LibxdpDir {
    #[must_use]
    pub fn hold() -> Self {
        let mut u = LIBXDP_USERS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if u.0 == 0 {
            u.1 = std::path::Path::new(LIBXDP_DIR).exists();
        }
        u.0 += 1;
        Self
    }
}

impl Drop for LibxdpDir {
    fn drop(&mut self) {
        let mut u = LIBXDP_USERS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        u.0 -= 1;
        if u.0 == 0 && !u.1 {
            // Only an empty directory goes: a pin of anyone's stays.
            let _ = std::fs::remove_dir(LIBXDP_DIR);
        }
    }
}

/// `xdp-loader status` of the receiver's interface.
///
/// A run that fails or does not name the interface (seen once in a CI
/// run: a status without the program the test had just listed, and
/// nothing said why) is tried again, up to three times; then what it
/// printed and said is the answer, so that a failure shows it.
#[must_use]
pub fn loader_status(net: &VethPair) -> String {
    let mut said = String::new();
    for _ in 0..3 {
        let o = net.b.net_command("xdp-loader").args(["status", B_IF]).output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        if o.status.success() && out.lines().any(|l| l.split_whitespace().next() == Some(B_IF)) {
            return out;
        }
        said =
            format!("{out}\n(xdp-loader status {B_IF}: {}; {})", o.status, String::from_utf8_lossy(&o.stderr).trim());
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    said
}

/// The id xdp-loader lists for program `name`.
#[must_use]
pub fn listed_id(status: &str, name: &str) -> Option<u32> {
    // The ID column: the number before the 16-digit tag (a component's
    // line starts with its priority).
    let words: Vec<&str> = status.lines().find(|l| l.contains(name))?.split_whitespace().collect();
    let tag = words.iter().position(|w| w.len() == 16 && w.chars().all(|c| c.is_ascii_hexdigit()))?;
    words.get(tag.checked_sub(1)?)?.parse().ok()
}

/// A source xdp-filter denies.
pub const FILTERED_SRC: &str = "198.18.3.10";

/// xdp-filter (Debian's xdp-tools) loaded on the receiver's interface
/// through libxdp; unloaded when the test ends, its pinned maps with it.
/// Its maps are the host's (one set for every interface), so one test of
/// a process holds it at a time.
pub struct XdpFilter<'a> {
    net: &'a VethPair,
    _one: std::sync::MutexGuard<'static, ()>,
}

static XDP_FILTER: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl<'a> XdpFilter<'a> {
    #[must_use]
    pub fn load(net: &'a VethPair) -> Self {
        let one = XDP_FILTER.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let o = net.b.net_command("xdp-filter").args(["load", "-m", "native", B_IF]).output().unwrap();
        assert!(o.status.success(), "xdp-filter load: {}", String::from_utf8_lossy(&o.stderr));
        Self { net, _one: one }
    }
}

impl Drop for XdpFilter<'_> {
    fn drop(&mut self) {
        let _ = self.net.b.net_command("xdp-filter").args(["unload", B_IF]).output();
    }
}
