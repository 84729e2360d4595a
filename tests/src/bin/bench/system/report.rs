//! `bench system`'s tables and goals, from the best round of each row.

use super::{BURST, Filter, RATE, ROUNDS, Row, SECS, conform, head};

/// The deny set beside xdp-filter, same flood, same CPU: drops per
/// CPU-second (the goal: a deny costs at most 1.1x xdp-filter's drop, so
/// at least 1/1.1 of its drops per CPU-second).
pub(super) fn deny_goal(title: &str, rows: &[Row]) {
    let rate = |f: Filter| rows.iter().find(|r| r.filter == f).map(|r| r.dropped as f64 / r.cpu_secs.max(1e-9));
    if let (Some(xf), Some(deny)) = (rate(Filter::XdpFilt), rate(Filter::LimiterDeny)) {
        println!(
            "goal: {title}: the deny set's drops per CPU-second at least 1/1.1 of xdp-filter's, same flood -> {} \
             ({:.2}M vs {:.2}M, {:.2}x)",
            if deny >= xf / 1.1 { "met" } else { "NOT met" },
            deny / 1e6,
            xf / 1e6,
            deny / xf
        );
    }
}

pub(super) fn print_own_cpu(title: &str, rows: &[Row]) {
    let rate = |r: &Row| r.dropped as f64 / r.cpu_secs.max(1e-9);
    let best = rows.iter().filter(|r| r.filter.netfilter()).map(rate).fold(0.0, f64::max);
    println!(
        "system flood, {title}, receiver on its own CPU: {RATE}/s burst {BURST} per /24, {SECS} s a row, CPU 1 busy \
         time, best of {ROUNDS} rounds"
    );
    println!(
        "{:<38} {:>8} {:>8} {:>8} {:>7} {:>10} {:>6} {:>7} {:>8}",
        "receiver", "sent", "received", "dropped", "recv-s", "drops/CPUs", "x best", "gen-s", "conform"
    );
    for r in rows {
        let (c, g) = (r.cpu_secs, r.gen_secs);
        println!("{} {c:>7.2} {:>9.2}M {:>6.2} {g:>7.2} {:>8}", head(r), rate(r) / 1e6, rate(r) / best, conform(r));
    }
    let lim = rows.iter().find(|r| r.filter == Filter::Limiter).unwrap();
    let touch = rows.iter().find(|r| r.filter == Filter::TouchDrop).unwrap();
    println!(
        "goal: limiter drops per receiver CPU-second at least 5x the better netfilter peer -> {:.2}x {} (reading the \
         header, then XDP_DROP: {:.2}x; a bare XDP_DROP: {:.2}x; conform: lost/sent over all rounds)",
        rate(lim) / best,
        if rate(lim) / best >= 5.0 { "met" } else { "NOT met" },
        rate(touch) / best,
        rate(&rows[0]) / best,
    );
}

pub(super) fn print_same_cpu(title: &str, rows: &[Row]) {
    let per_frame = |r: &Row| r.cpu_secs / r.frames as f64;
    let gen_cost = per_frame(&rows[0]);
    let own = |r: &Row| (per_frame(r) - gen_cost).max(1e-12) * r.frames as f64;
    let rate = |r: &Row| r.dropped as f64 / r.cpu_secs;
    let rate_own = |r: &Row| r.dropped as f64 / own(r);
    let best = |f: &dyn Fn(&Row) -> f64| rows.iter().filter(|r| r.filter.netfilter()).map(f).fold(0.0, f64::max);
    let (best, best_own) = (best(&rate), best(&rate_own));
    println!(
        "system flood, {title}, receiver on the generator's CPU: {RATE}/s burst {BURST} per /24, {SECS} s a row, \
         CPU 0 busy time, best of {ROUNDS} rounds"
    );
    println!(
        "{:<38} {:>8} {:>8} {:>8} {:>6} {:>10} {:>6} {:>10} {:>6} {:>8}",
        "receiver", "sent", "received", "dropped", "CPU-s", "drops/CPUs", "x best", "recv-only", "x best", "conform"
    );
    for r in rows {
        // Nothing to subtract from a receiver that costs what a bare drop
        // does when the frames arrive hot.
        let bare = r.filter.drops_all();
        let own_rate = if bare { "-".into() } else { format!("{:.2}M", rate_own(r) / 1e6) };
        let own_x = if bare { "-".into() } else { format!("{:.2}", rate_own(r) / best_own) };
        let (c, x) = (r.cpu_secs, rate(r) / best);
        println!("{} {c:>6.2} {:>9.2}M {x:>6.2} {own_rate:>10} {own_x:>6} {:>8}", head(r), rate(r) / 1e6, conform(r));
    }
    let lim = rows.iter().find(|r| r.filter == Filter::Limiter).unwrap();
    println!(
        "goal: limiter drops/CPU-s at least 5x the better netfilter peer -> {:.2}x end to end ({:.2}x for a bare \
         XDP_DROP, the ceiling with the generator in the bill), {:.2}x receiver only: {} (conform: lost/sent over \
         all rounds)",
        rate(lim) / best,
        rate(&rows[0]) / best,
        rate_own(lim) / best_own,
        if rate_own(lim) / best_own >= 5.0 { "met" } else { "NOT met" }
    );
    let (of_bare, of_best) = (rate(lim) / rate(&rows[0]), rate(lim) / best);
    println!(
        "goal: limiter drops/CPU-s at least 80% of a bare XDP_DROP's -> {} ({:.0}%), at least 3x the better \
         netfilter peer end to end -> {} ({:.2}x)",
        if of_bare >= 0.8 { "met" } else { "NOT met" },
        of_bare * 100.0,
        if of_best >= 3.0 { "met" } else { "NOT met" },
        of_best
    );
}
