//! The running kernel: its release, and what the program needs of it.
//!
//! Supported kernels are those the guest tier of `cargo xtask test` runs
//! the program on (Debian 12's 6.1 and Debian 13's 6.12) and the
//! development machines' (6.18); the oldest is [`MINIMUM`].

pub mod refusal;

/// The oldest kernel release this program is built and tested for.
pub const MINIMUM: (u32, u32) = (6, 1);

/// The running kernel's release, as `uname -r` prints it.
#[must_use]
pub fn release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_owned()).unwrap_or_default()
}

/// The major and minor version of a release string (`6.1.0-57-amd64` ->
/// `(6, 1)`), if it starts with them.
#[must_use]
pub fn version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// "; this kernel is older than 6.1, ..." for a release below
/// [`MINIMUM`], else nothing: said beside a refusal.
#[must_use]
pub fn older_note(release: &str) -> String {
    match version(release) {
        Some(v) if v < MINIMUM => format!(
            " (this kernel is older than {}.{}, the oldest this build supports: docs/operations.md#kernels)",
            MINIMUM.0, MINIMUM.1
        ),
        _ => String::new(),
    }
}

/// A BPF helper the program calls, the kernel release that brought it to
/// XDP programs, and what of the program needs it.
pub struct Helper {
    pub id: aya::sys::BpfHelper,
    pub name: &'static str,
    pub since: &'static str,
    pub needed_by: &'static str,
}

/// Every helper the production program calls beyond the map helpers
/// (which every kernel with XDP has).
pub const HELPERS: &[Helper] = {
    use aya::sys::BpfHelper as H;
    &[
        Helper { id: H::BPF_FUNC_jiffies64, name: "bpf_jiffies64", since: "5.5", needed_by: "the clock" },
        Helper {
            id: H::BPF_FUNC_ringbuf_output,
            name: "bpf_ringbuf_output",
            since: "5.8",
            needed_by: "drop samples and fleet events",
        },
        Helper {
            id: H::BPF_FUNC_ktime_get_coarse_ns,
            name: "bpf_ktime_get_coarse_ns",
            since: "5.11",
            needed_by: "the clock",
        },
        Helper {
            id: H::BPF_FUNC_map_lookup_percpu_elem,
            name: "bpf_map_lookup_percpu_elem",
            since: "5.19",
            needed_by: "taking back other CPUs' leases",
        },
        Helper {
            id: H::BPF_FUNC_tcp_raw_gen_syncookie_ipv4,
            name: "bpf_tcp_raw_gen_syncookie_ipv4",
            since: "6.0",
            needed_by: SYN_COOKIES,
        },
        Helper {
            id: H::BPF_FUNC_tcp_raw_check_syncookie_ipv6,
            name: "bpf_tcp_raw_check_syncookie_ipv6",
            since: "6.0",
            needed_by: SYN_COOKIES,
        },
    ]
};

/// What the helpers of SYN cookies are needed by: the one feature a
/// program without them can run without.
pub const SYN_COOKIES: &str = "SYN cookies";

/// The helpers of [`HELPERS`] this kernel lacks for XDP programs (a probe
/// that cannot tell counts as present: the load then says).
#[must_use]
pub fn missing_helpers() -> Vec<&'static Helper> {
    let pretended = pretended_missing();
    HELPERS
        .iter()
        .filter(|h| {
            pretended.iter().any(|p| p == h.name)
                || matches!(aya::sys::is_helper_supported(aya::programs::ProgramType::Xdp, h.id), Ok(false))
        })
        .collect()
}

/// Helpers a test build counts as missing (`LIMITER_TEST_KERNEL_LACKS`,
/// comma-separated names): no kernel these tests run on lacks only the
/// SYN cookie helpers. Never in a release build.
fn pretended_missing() -> Vec<String> {
    #[cfg(feature = "testing")]
    if let Ok(v) = std::env::var("LIMITER_TEST_KERNEL_LACKS") {
        return v.split(',').map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect();
    }
    Vec::new()
}

/// Which of the two objects the daemon loads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Program {
    /// The production object, every feature in it.
    #[default]
    Full,
    /// The object built without SYN cookies, for a kernel without their
    /// helpers (the whole object is verified, used or not, so a program
    /// that calls them would be refused whole).
    WithoutSynCookies,
}

impl Program {
    /// The object's bytes.
    #[must_use]
    pub fn object(self) -> &'static [u8] {
        match self {
            Self::Full => super::OBJECT,
            Self::WithoutSynCookies => super::OBJECT_WITHOUT_SYN_COOKIES,
        }
    }
}

/// The program this kernel runs, and what it lacks for the features left
/// out (one clause: "kernel R lacks ..."); and its run priority under a
/// libxdp dispatcher (written into the object before it is loaded: see
/// [`super::run_priority`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub program: Program,
    pub lacks: Option<String>,
    pub priority: u32,
}

impl Default for Plan {
    fn default() -> Self {
        Self { program: Program::Full, lacks: None, priority: limiter_common::RUN_PRIORITY_DEFAULT }
    }
}

/// The program for this kernel: refused in one line when it lacks a
/// helper no program runs without (the line names the helpers, what
/// needs them and the oldest supported kernel), the one without SYN
/// cookies when it lacks only theirs (whether the policy may run so is
/// the policy's to say: [`crate::policy::kernel::MissingFeature`]).
pub fn plan() -> Result<Plan, String> {
    plan_for(&release(), &missing_helpers())
}

fn plan_for(release: &str, missing: &[&Helper]) -> Result<Plan, String> {
    if missing.iter().any(|h| h.needed_by != SYN_COOKIES) {
        return Err(refusal(release, missing));
    }
    if missing.is_empty() {
        return Ok(Plan::default());
    }
    let names: Vec<&str> = missing.iter().map(|h| h.name).collect();
    Ok(Plan {
        program: Program::WithoutSynCookies,
        priority: limiter_common::RUN_PRIORITY_DEFAULT,
        lacks: Some(format!(
            "kernel {release} lacks {} (kernel {}+ built with CONFIG_SYN_COOKIES)",
            names.join(" and "),
            missing[0].since
        )),
    })
}

fn refusal(release: &str, missing: &[&Helper]) -> String {
    let what: Vec<String> =
        missing.iter().map(|h| format!("{} (kernel {}+, for {})", h.name, h.since, h.needed_by)).collect();
    format!(
        "kernel {release} lacks {}, which the program calls; the oldest kernel this build supports is {}.{} (docs/operations.md#kernels)",
        what.join(", "),
        MINIMUM.0,
        MINIMUM.1
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_from_distribution_release_strings() {
        assert_eq!(version("6.1.0-57-amd64"), Some((6, 1)));
        assert_eq!(version("6.12.118+deb13-amd64"), Some((6, 12)));
        assert_eq!(version("6.18.44-fc-v1147"), Some((6, 18)));
        assert_eq!(version("5.10"), Some((5, 10)));
        assert_eq!(version("linux"), None);
        assert_eq!(version(""), None);
    }

    #[test]
    fn a_refusal_is_one_line_naming_each_missing_helper_and_the_minimum() {
        let missing: Vec<&Helper> = HELPERS.iter().filter(|h| h.since == "6.0" || h.since == "5.11").collect();
        let line = refusal("5.10.0-35-amd64", &missing);
        assert!(!line.contains('\n'));
        assert!(
            line.starts_with("kernel 5.10.0-35-amd64 lacks bpf_ktime_get_coarse_ns (kernel 5.11+, for the clock), ")
        );
        assert!(line.contains("bpf_tcp_raw_gen_syncookie_ipv4 (kernel 6.0+, for SYN cookies)"), "{line}");
        assert!(line.ends_with("the oldest kernel this build supports is 6.1 (docs/operations.md#kernels)"), "{line}");
    }

    #[test]
    fn without_the_cookie_helpers_the_program_without_cookies_runs_and_without_others_none() {
        let only = |f: &dyn Fn(&Helper) -> bool| HELPERS.iter().filter(|h| f(h)).collect::<Vec<_>>();
        assert_eq!(plan_for("6.1.0-57-amd64", &[]), Ok(Plan::default()));
        let cookies = only(&|h| h.needed_by == SYN_COOKIES);
        assert_eq!(cookies.len(), 2);
        let p = plan_for("6.1.0-57-amd64", &cookies).unwrap();
        assert_eq!(p.program, Program::WithoutSynCookies);
        let lacks = p.lacks.unwrap();
        assert!(lacks.starts_with("kernel 6.1.0-57-amd64 lacks bpf_tcp_raw_gen_syncookie_ipv4 and "), "{lacks}");
        assert!(lacks.ends_with("(kernel 6.0+ built with CONFIG_SYN_COOKIES)"), "{lacks}");
        // One essential helper among them: refused, every one named.
        let mut both = cookies.clone();
        both.extend(only(&|h| h.name == "bpf_map_lookup_percpu_elem"));
        let line = plan_for("5.15.0-1-amd64", &both).unwrap_err();
        assert!(
            line.contains("bpf_map_lookup_percpu_elem") && line.contains("bpf_tcp_raw_gen_syncookie_ipv4"),
            "{line}"
        );
        assert!(!line.contains('\n'));
    }

    #[test]
    fn older_releases_are_noted_and_supported_ones_are_not() {
        assert!(older_note("5.10.0-35-amd64").contains("older than 6.1"));
        assert_eq!(older_note("6.1.0-57-amd64"), "");
        assert_eq!(older_note("6.12.118+deb13-amd64"), "");
    }
}
