//! `limiter run`: load, attach, enforce the policy, reload it on SIGHUP,
//! print status; `limiter unload`; `limiter policy check`.

use std::{
    fmt::Write as _,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use tokio::signal::unix::{SignalKind, signal};

use crate::{
    cli::RunArgs,
    loader::Limiter,
    policy::{self, Policy},
    stats::Totals,
};

/// Run the daemon until SIGINT or SIGTERM.
pub async fn run(args: &RunArgs) -> anyhow::Result<()> {
    let policy = args.load_policy()?;
    // Validate before touching the kernel: a bad policy changes nothing.
    policy.compile(0)?;
    raise_memlock();
    let (mut limiter, adopted) = if args.pin {
        Limiter::open_pinned(policy.capacity, &args.pin_dir)?
    } else {
        (Limiter::open(policy.capacity)?, false)
    };
    // Versions continue from what a re-adopted data plane enforces.
    let mut version = limiter.active_config()?.map_or(0, |c| c.version) + 1;
    // Config first, then attach: the program never runs without a policy.
    limiter.apply(&policy.compile(version)?, &policy.compile_overrides()?)?;
    let (link, replaced) = if args.pin {
        (None, limiter.attach_pinned(&args.iface, args.mode, &args.pin_dir)?)
    } else {
        (Some(limiter.attach(&args.iface, args.mode)?), false)
    };
    let capacity = limiter.capacity()?;
    println!(
        "limiter: attached to {} ({}), {}, capacity {capacity}",
        args.iface,
        args.mode.label(),
        describe(&policy, version)
    );
    if args.pin {
        println!(
            "limiter: pinned in {}; {}; {}",
            args.pin_dir.display(),
            if adopted { "re-adopted pinned maps (buckets and counters kept)" } else { "new maps" },
            if replaced { "replaced the program on the pinned link atomically" } else { "new link" },
        );
        if capacity != policy.capacity {
            println!("limiter: capacity stays {capacity} (pinned map); `limiter unload` and restart to change it");
        }
    }

    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    let period = Duration::from_secs_f64(if args.status_interval > 0.0 { args.status_interval } else { 3600.0 });
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    let (mut last, mut last_at) = (limiter.totals()?, Instant::now());
    let why = loop {
        tokio::select! {
            _ = term.recv() => break "SIGTERM",
            _ = int.recv() => break "SIGINT",
            _ = hup.recv() => {
                if reload(args, &mut limiter, version, capacity)? {
                    version += 1;
                }
            }
            _ = tick.tick(), if args.status_interval > 0.0 => {
                let now = limiter.totals()?;
                let status = status_line(&now, &last, last_at.elapsed(), limiter.tracked()?, capacity);
                println!("{status} policy v{version}");
                (last, last_at) = (now, Instant::now());
            }
        }
    };
    let t = limiter.totals()?;
    let (passed, dropped) = (t.passed().packets, t.dropped().packets);
    if let Some(link) = link {
        limiter.detach(link)?;
        println!("limiter: {why}: detached from {}; passed {passed} dropped {dropped} packets in total", args.iface);
    } else {
        println!(
            "limiter: {why}: stopping; XDP stays attached to {} and enforcing (pinned in {}; `limiter unload` removes it); passed {passed} dropped {dropped} packets in total",
            args.iface,
            args.pin_dir.display()
        );
    }
    Ok(())
}

/// Re-read and apply the policy as version `running + 1`, all or nothing.
/// A rejected policy is reported and the running one stays. Returns whether
/// the new version was applied.
fn reload(args: &RunArgs, limiter: &mut Limiter, running: u64, capacity: u32) -> anyhow::Result<bool> {
    let source = args.policy_source().map_or_else(|| "built-in policy".to_owned(), |p| p.display().to_string());
    let next = running + 1;
    let compiled = args.load_policy().and_then(|p| {
        let cfg = p.compile(next)?;
        let ovr = p.compile_overrides()?;
        Ok((p, cfg, ovr))
    });
    match compiled {
        Ok((p, cfg, ovr)) => {
            limiter.apply(&cfg, &ovr)?;
            println!("limiter: SIGHUP: applied {source}: {}", describe(&p, next));
            if p.capacity != capacity {
                println!("limiter: capacity stays {capacity}; a new capacity needs a restart");
            }
            Ok(true)
        }
        Err(e) => {
            println!("limiter: SIGHUP: rejected {source}: {e}; policy v{running} keeps running");
            Ok(false)
        }
    }
}

/// One line about a policy.
#[must_use]
pub fn describe(p: &Policy, version: u64) -> String {
    let d = p.default;
    let mut s = format!(
        "policy v{version}: rate {} {}/s burst {} per IPv4 /{} and IPv6 /{} ({})",
        d.rate,
        d.cost.label(),
        d.burst,
        p.v4_prefix,
        p.v6_prefix,
        d.mode.label()
    );
    for c in &p.classes {
        let l = c.limit;
        let _ = write!(s, "; class {}: rate {} burst {} ({})", c.name, l.rate, l.burst, l.mode.label());
    }
    if !p.overrides.is_empty() {
        let _ = write!(s, "; {} overrides", p.overrides.len());
    }
    s
}

/// `limiter unload`: remove the pins; the link goes with its last pin.
pub fn unload(args: &crate::cli::UnloadArgs) -> anyhow::Result<()> {
    let removed = crate::pin::unload(&args.pin_dir, args.keep_maps)?;
    if removed.is_empty() {
        println!("limiter: nothing pinned in {}", args.pin_dir.display());
    } else {
        println!("limiter: removed {} from {}", removed.join(", "), args.pin_dir.display());
    }
    Ok(())
}

/// `limiter policy check FILE`.
pub fn check(file: &Path) -> anyhow::Result<()> {
    let p = policy::file::load(file, &Policy::default()).context("invalid policy")?;
    println!("{}: valid; {}", file.display(), describe(&p, 0).trim_start_matches("policy v0: "));
    Ok(())
}

/// `passed P (r/s) dropped D (r/s) tracked N/CAP`, plus nonzero drop reasons.
#[must_use]
pub fn status_line(now: &Totals, last: &Totals, dt: Duration, tracked: usize, capacity: u32) -> String {
    let d = now.since(last);
    let secs = dt.as_secs_f64().max(1e-9);
    #[expect(clippy::cast_precision_loss, reason = "display only")]
    let rate = |n: u64| n as f64 / secs;
    let mut line = format!(
        "passed {} ({:.0}/s) dropped {} ({:.0}/s) tracked {tracked}/{capacity}",
        now.passed().packets,
        rate(d.passed().packets),
        now.dropped().packets,
        rate(d.dropped().packets),
    );
    for r in limiter_common::Reason::ALL {
        let c = now.get(r);
        if (r.verdict() == limiter_common::Verdict::Drop || r == limiter_common::Reason::ShadowDropped) && c.packets > 0
        {
            let _ = write!(line, " {}={}", r.label(), c.packets);
        }
    }
    line
}

/// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK; lift it.
fn raise_memlock() {
    let lim = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: plain syscall on a valid struct; failure only matters on old kernels.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &raw const lim) };
}
