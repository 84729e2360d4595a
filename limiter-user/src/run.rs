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
    let mut limiter = Limiter::open(policy.capacity)?;
    // Config first, then attach: the program never runs without a policy.
    limiter.set_config(&cfg)?;
    let link = limiter.attach(&args.iface, args.mode)?;
    println!(
        "limiter: attached to {} ({}), rate {} {}/s burst {} per IPv4 /{} and IPv6 /{}, capacity {}",
        args.iface,
        args.mode.label(),
        policy.rate,
        policy.cost.label(),
        policy.burst,
        policy.v4_prefix,
        policy.v6_prefix,
        policy.capacity
    );

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
                println!("{}", status_line(&now, &last, last_at.elapsed(), limiter.tracked()?, policy.capacity));
                (last, last_at) = (now, Instant::now());
            }
        }
    };
    let t = limiter.totals()?;
    limiter.detach(link)?;
    println!(
        "limiter: {why}: detached from {}; passed {} dropped {} packets in total",
        args.iface,
        t.passed().packets,
        t.dropped().packets
    );
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
