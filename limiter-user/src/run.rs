//! `limiter run`: load, attach, print status, detach on SIGINT/SIGTERM.

use std::{
    fmt::Write as _,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use tokio::signal::unix::{SignalKind, signal};

use crate::{cli::RunArgs, loader::Limiter, stats::Totals};

/// Run the daemon until a signal arrives; the XDP link is detached on return.
pub async fn run(args: &RunArgs) -> anyhow::Result<()> {
    let policy = args.policy();
    let cfg = policy.to_config().context("invalid policy")?;
    raise_memlock();
    let (mut limiter, adopted) = if args.pin {
        Limiter::open_pinned(policy.capacity, &args.pin_dir)?
    } else {
        (Limiter::open(policy.capacity)?, false)
    };
    // Config first, then attach: the program never runs without a policy.
    limiter.set_config(&cfg)?;
    let (link, replaced) = if args.pin {
        (
            None,
            limiter.attach_pinned(&args.iface, args.mode, &args.pin_dir)?,
        )
    } else {
        (Some(limiter.attach(&args.iface, args.mode)?), false)
    };
    let capacity = limiter.capacity()?;
    println!(
        "limiter: attached to {} ({}), rate {} {}/s burst {} per IPv4 /{} and IPv6 /{}, capacity {capacity}",
        args.iface,
        args.mode.label(),
        policy.rate,
        policy.cost.label(),
        policy.burst,
        policy.v4_prefix,
        policy.v6_prefix,
    );
    if args.pin {
        println!(
            "limiter: pinned in {}; {}; {}",
            args.pin_dir.display(),
            if adopted {
                "re-adopted pinned maps (buckets and counters kept)"
            } else {
                "new maps"
            },
            if replaced {
                "replaced the program on the pinned link atomically"
            } else {
                "new link"
            },
        );
        if capacity != policy.capacity {
            println!(
                "limiter: capacity stays {capacity} (pinned map); `limiter unload` and restart to change it"
            );
        }
    }

    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let period = Duration::from_secs_f64(if args.status_interval > 0.0 {
        args.status_interval
    } else {
        3600.0
    });
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    let (mut last, mut last_at) = (Totals::default(), Instant::now());
    let why = loop {
        tokio::select! {
            _ = term.recv() => break "SIGTERM",
            _ = int.recv() => break "SIGINT",
            _ = tick.tick(), if args.status_interval > 0.0 => {
                let now = limiter.totals()?;
                println!("{}", status_line(&now, &last, last_at.elapsed(), limiter.tracked()?, capacity));
                (last, last_at) = (now, Instant::now());
            }
        }
    };
    let t = limiter.totals()?;
    let (passed, dropped) = (t.passed().packets, t.dropped().packets);
    if let Some(link) = link {
        limiter.detach(link)?;
        println!(
            "limiter: {why}: detached from {}; passed {passed} dropped {dropped} packets in total",
            args.iface
        );
    } else {
        println!(
            "limiter: {why}: stopping; XDP stays attached to {} and enforcing (pinned in {}; `limiter unload` removes it); passed {passed} dropped {dropped} packets in total",
            args.iface,
            args.pin_dir.display()
        );
    }
    Ok(())
}

/// `limiter unload`: remove the pins; the link goes with its last pin.
pub fn unload(args: &crate::cli::UnloadArgs) -> anyhow::Result<()> {
    let removed = crate::pin::unload(&args.pin_dir, args.keep_maps)?;
    if removed.is_empty() {
        println!("limiter: nothing pinned in {}", args.pin_dir.display());
    } else {
        println!(
            "limiter: removed {} from {}",
            removed.join(", "),
            args.pin_dir.display()
        );
    }
    Ok(())
}

/// `passed P (r/s) dropped D (r/s) tracked N/CAP`, plus nonzero drop reasons.
#[must_use]
pub fn status_line(
    now: &Totals,
    last: &Totals,
    dt: Duration,
    tracked: usize,
    capacity: u32,
) -> String {
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
        if r.verdict() == limiter_common::Verdict::Drop && c.packets > 0 {
            let _ = write!(line, " {}={}", r.label(), c.packets);
        }
    }
    line
}

/// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK; lift it.
fn raise_memlock() {
    let lim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: plain syscall on a valid struct; failure only matters on old kernels.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &raw const lim) };
}
