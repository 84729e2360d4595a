//! A policy against the kernel it runs on: SYN cookies on a kernel
//! without their helpers (the daemon then runs the program without them,
//! [`crate::dataplane::kernel::Program::WithoutSynCookies`]) are refused
//! unless the policy says `missing_kernel_feature = "run-without"`.

use limiter_common::flags;

use crate::policy::{Compiled, Policy, PolicyError, SynCookies, bad, kernel::MissingFeature};

/// How the policy's SYN cookies run, if it asks for any: off (and why)
/// where the kernel `lacks` their helpers and the policy may run so, or
/// where the kernel would not accept their ACKs (never claim protection
/// that is not there: such cookies would only break the connections they
/// answer); else with this host's TCP options (and why only the MSS, when
/// it cannot tell them). Refused where the policy may not run without.
pub(super) fn cookies(
    p: &Policy,
    compiled: &mut Compiled,
    lacks: Option<&str>,
) -> Result<(Option<String>, Option<String>), PolicyError> {
    if compiled.config.flags & flags::SYN_COOKIES == 0 {
        return Ok((None, None));
    }
    let off = match lacks {
        Some(lacks) => cookies_without_kernel(p, lacks)?,
        None => syn_cookies_ready().err().map(|e| e.to_string()),
    };
    if off.is_some() {
        compiled.config.flags &= !flags::SYN_COOKIES;
        return Ok((off, None));
    }
    let (opts, wscale, why) = cookie_options();
    (compiled.config.cookies.opts, compiled.config.cookies.wscale) = (opts, wscale);
    Ok((None, why))
}

/// Whether `policy` may run where the program has no SYN cookies because
/// the kernel `lacks` their helpers: `Ok(None)` when it asks for none,
/// `Ok(Some(why))` (why they are off, for its summary) when it asks for
/// them and may run without, else the refusal at the first class that
/// asks.
pub fn cookies_without_kernel(policy: &Policy, lacks: &str) -> Result<Option<String>, PolicyError> {
    let asking: Vec<(usize, &str)> = policy
        .classes
        .iter()
        .enumerate()
        .filter(|(_, c)| c.syn_cookies != SynCookies::Off)
        .map(|(i, c)| (i, c.name.as_str()))
        .collect();
    let Some(&(first, _)) = asking.first() else { return Ok(None) };
    let names: Vec<&str> = asking.iter().map(|(_, n)| *n).collect();
    match policy.missing_kernel_feature {
        MissingFeature::RunWithout => Ok(Some(format!(
            "{lacks}: class {} runs without them, as the policy asks (missing_kernel_feature = \"run-without\")",
            names.join(", ")
        ))),
        MissingFeature::Refuse => Err(bad(
            format!("class[{first}].syn_cookies"),
            format!(
                "{lacks}, so SYN cookies (class {}) cannot run here; write missing_kernel_feature = \"run-without\" \
                 to run this policy without them (docs/operations.md#kernels)",
                names.join(", ")
            ),
        )),
    }
}

/// Whether the kernel in this network namespace takes the ACKs of SYN
/// cookies sent from XDP: it checks them itself only with
/// `net.ipv4.tcp_syncookies = 2` (cookies always, so the SYNs the program
/// hands it keep the listener in its cookie state). `Err` says why not.
pub fn syn_cookies_ready() -> Result<(), CookiesUnready> {
    match std::fs::read_to_string(SYNCOOKIES_SYSCTL) {
        Ok(v) if v.trim() == "2" => Ok(()),
        Ok(v) => Err(CookiesUnready::Sysctl(v.trim().to_owned())),
        Err(e) => Err(CookiesUnready::Unreadable(e)),
    }
}

const SYNCOOKIES_SYSCTL: &str = "/proc/sys/net/ipv4/tcp_syncookies";

/// Why the kernel would not take the ACKs of cookies sent from XDP.
#[derive(Debug, thiserror::Error)]
pub enum CookiesUnready {
    #[error(
        "net.ipv4.tcp_syncookies is {0} in this network namespace; the kernel accepts the ACKs of cookies sent \
         from XDP only with 2 (sysctl -w net.ipv4.tcp_syncookies=2)"
    )]
    Sysctl(String),
    #[error("cannot read {SYNCOOKIES_SYSCTL} (a kernel without CONFIG_SYN_COOKIES?): {0}")]
    Unreadable(std::io::Error),
}

/// What a cookie's SYN-ACK may offer beside the MSS on this host, from
/// the sysctls of this network namespace: `(opts, wscale, why MSS only)`
/// ([`limiter_common::cookie::opt`]). The kernel reads window scaling and
/// SACK back from the timestamp echo, and first subtracts a secret
/// per-connection offset unless `net.ipv4.tcp_timestamps = 2`: with 1 (the
/// default) the SYN-ACK offers the MSS only. The window scale offered is
/// the one the kernel will take for the connection (`tcp_select_initial_window`:
/// the largest of `tcp_rmem`'s maximum and `net.core.rmem_max`).
#[must_use]
pub fn cookie_options() -> (u8, u8, Option<String>) {
    use limiter_common::cookie::{MAX_WSCALE, opt};
    let read = |name: &str| std::fs::read_to_string(format!("/proc/sys/net/{name}")).ok();
    let number = |name: &str, field: usize| {
        read(name).and_then(|v| v.split_whitespace().nth(field).and_then(|f| f.parse::<u64>().ok()))
    };
    let timestamps = number("ipv4/tcp_timestamps", 0).unwrap_or(0);
    if timestamps != 2 {
        let why = format!(
            "net.ipv4.tcp_timestamps is {timestamps}: SYN-ACKs of cookies offer the MSS only (2, timestamps without \
             per-connection offsets, lets them carry window scaling, SACK and timestamps)"
        );
        return (0, 0, Some(why));
    }
    let mut opts = opt::TIMESTAMPS;
    if number("ipv4/tcp_sack", 0).is_some_and(|v| v != 0) {
        opts |= opt::SACK;
    }
    if number("ipv4/tcp_window_scaling", 0).is_some_and(|v| v != 0) {
        opts |= opt::WSCALE;
    }
    let space =
        number("ipv4/tcp_rmem", 2).unwrap_or(0).max(number("core/rmem_max", 0).unwrap_or(0)).min(u64::from(u32::MAX));
    let wscale = u8::try_from(space.max(1).ilog2().saturating_sub(15)).unwrap_or(MAX_WSCALE).min(MAX_WSCALE);
    (opts, wscale, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::file;

    const LACKS: &str = "kernel 6.1.0-57-amd64 lacks bpf_tcp_raw_gen_syncookie_ipv4";

    fn policy(extra: &str) -> Policy {
        let text = format!(
            "{extra}\n[[class]]\nname = \"web\"\nprotocol = \"tcp\"\nports = [443]\nsyn = true\nrate = 5\nburst = 5\n\
             syn_cookies = \"always\"\n"
        );
        file::parse("p.toml", text).unwrap().policy
    }

    #[test]
    fn cookies_on_a_kernel_without_them_are_refused_unless_the_policy_runs_without() {
        assert_eq!(cookies_without_kernel(&Policy::default(), LACKS), Ok(None));
        let e = cookies_without_kernel(&policy(""), LACKS).unwrap_err();
        assert_eq!(e.field, "class[0].syn_cookies");
        assert!(e.problem.starts_with(LACKS) && e.problem.contains("run-without"), "{e}");
        let why = cookies_without_kernel(&policy("missing_kernel_feature = \"run-without\""), LACKS).unwrap();
        assert!(why.is_some_and(|w| w.starts_with(LACKS) && w.contains("class web runs without them")));
    }

    #[test]
    fn the_key_is_read_and_written_back_and_a_wrong_value_is_named() {
        let p = policy("missing_kernel_feature = \"run-without\"");
        assert_eq!(p.missing_kernel_feature, MissingFeature::RunWithout);
        let text = file::render(&p);
        assert!(text.contains("missing_kernel_feature = \"run-without\""), "{text}");
        assert!(!file::render(&Policy::default()).contains("missing_kernel_feature"));
        let e = file::parse("p.toml", "missing_kernel_feature = \"ignore\"\n".into()).unwrap_err();
        assert!(e.to_string().contains("missing_kernel_feature"), "{e}");
    }
}
