//! `LIMITER_BENCH_PROFILE=1`: `perf record` on the generator's CPU while
//! each system-flood row runs, and each symbol's time per frame, the
//! limiter's row beside a bare `XDP_DROP`'s (what the limiter adds to a
//! live flood, kernel functions included, not only its own program).

use std::{
    collections::HashMap,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use crate::jitlines::JitLines;

/// One sample every this many ns of CPU time (`cpu-clock`: this VM has no
/// hardware counters).
const PERIOD_NS: u64 = 100_000;

/// Whether rows are profiled.
pub fn wanted() -> bool {
    std::env::var_os("LIMITER_BENCH_PROFILE").is_some()
}

/// A `perf record` of one CPU, running.
pub struct Recording {
    child: Child,
    file: PathBuf,
}

impl Recording {
    /// Start recording `cpu`, and give perf time to set up before the
    /// caller's measurement begins.
    pub fn start(cpu: usize) -> Self {
        let file = std::env::temp_dir().join(format!("limiter-bench-{}.perf", std::process::id()));
        let child = Command::new("perf")
            .args(["record", "-q", "-e", "cpu-clock", "-c", &PERIOD_NS.to_string(), "-C", &cpu.to_string(), "-o"])
            .arg(&file)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run perf (LIMITER_BENCH_PROFILE needs the linux-perf package)");
        std::thread::sleep(Duration::from_millis(700));
        Self { child, file }
    }

    /// Stop, and each symbol's ns per frame over `frames` (idle left out);
    /// with `lines`, that program's functions by source line too.
    pub fn stop(mut self, frames: u64, lines: Option<&JitLines>) -> Profile {
        // SAFETY: kill has no memory preconditions; perf writes its file
        // on SIGINT.
        unsafe { libc::kill(self.child.id().cast_signed(), libc::SIGINT) };
        let _ = self.child.wait();
        let out = Command::new("perf")
            .args(["script", "-F", "ip,sym,symoff", "-i"])
            .arg(&self.file)
            .output()
            .expect("perf script");
        let _ = std::fs::remove_file(&self.file);
        let per_sample = PERIOD_NS as f64 / frames.max(1) as f64;
        let mut p = Profile::default();
        for sample in String::from_utf8_lossy(&out.stdout).lines() {
            // "ffffffffc0035b51 bpf_prog_f17dcd4fe987cb19_limiter+0x2e5"
            let mut fields = sample.split_whitespace();
            let ip = fields.next().and_then(|ip| u64::from_str_radix(ip, 16).ok());
            let Some(sym) = fields.next() else { continue };
            let sym = sym.rsplit_once("+0x").map_or(sym, |(s, _)| s);
            if sym.contains("safe_halt") || sym.contains("cpuidle") {
                continue;
            }
            *p.ns.entry(name(sym)).or_insert(0.0) += per_sample;
            if let (Some(lines), Some(ip)) = (lines, ip)
                && sym.starts_with("bpf_prog_")
                && let Some(line) = lines.at(ip)
            {
                *p.by_file.entry(part(&line.path)).or_insert(0.0) += per_sample;
                *p.by_line.entry(line.to_string()).or_insert(0.0) += per_sample;
            }
        }
        p
    }
}

/// A BPF program's symbol without its tag, and the receivers' programs
/// under one name, so that rows compare.
fn name(sym: &str) -> String {
    let Some(rest) = sym.strip_prefix("bpf_prog_") else { return sym.to_string() };
    let prog = rest.split_once('_').map_or(rest, |(_, p)| p);
    match prog {
        "limiter" | "baseline_drop" | "bench_touch_drop" => "receiver's XDP program".into(),
        p => format!("bpf_prog {p}"),
    }
}

/// ns per frame by symbol, and a program's by source file and line.
#[derive(Default)]
pub struct Profile {
    ns: HashMap<String, f64>,
    by_file: HashMap<&'static str, f64>,
    by_line: HashMap<String, f64>,
}

/// The symbols that differ most between `bare` and `lim`, ns per frame,
/// as recorded on `cpu`.
pub fn print(title: &str, cpu: usize, bare: &Profile, lim: &Profile) {
    let total = |p: &Profile| p.ns.values().sum::<f64>();
    println!(
        "profile, {title} (perf on CPU {cpu}, ns per frame; a bare XDP_DROP {:.1} ns, the limiter {:.1} ns):",
        total(bare),
        total(lim)
    );
    let mut syms: Vec<&String> = bare.ns.keys().chain(lim.ns.keys()).collect();
    syms.sort();
    syms.dedup();
    let get = |p: &Profile, s: &str| p.ns.get(s).copied().unwrap_or(0.0);
    syms.sort_by(|a, b| {
        let d = |s: &str| (get(lim, s) - get(bare, s)).abs();
        d(b).total_cmp(&d(a))
    });
    println!("  {:<44} {:>8} {:>8} {:>8}", "symbol", "bare", "limiter", "added");
    for s in syms.iter().take(16) {
        let (b, l) = (get(bare, s), get(lim, s));
        println!("  {s:<44} {b:>8.2} {l:>8.2} {:>+8.2}", l - b);
    }
    let mut files: Vec<(&str, f64)> = lim.by_file.iter().map(|(p, ns)| (*p, *ns)).collect();
    files.sort_by(|a, b| b.1.total_cmp(&a.1));
    let of = lim.by_line.values().sum::<f64>();
    println!("  the limiter's program by source file:");
    for (part, ns) in &files {
        println!("  {ns:>6.2} ns {:>5.1}%  {part}", ns / of.max(1e-9) * 100.0);
    }
    let mut lines: Vec<(&String, &f64)> = lim.by_line.iter().collect();
    lines.sort_by(|a, b| b.1.total_cmp(a.1));
    println!("  the limiter's program by source line (a sample lands just after the instruction that held the CPU):");
    for (line, ns) in lines.iter().take(24) {
        let line: String = line.chars().take(96).collect();
        println!("  {ns:>6.2} ns {:>5.1}%  {line}", *ns / of.max(1e-9) * 100.0);
    }
}

/// What part of the program a source file belongs to (by its path as the
/// compiler recorded it: every function but the entry point's own is
/// inlined from a file of its own).
fn part(path: &str) -> &'static str {
    let file = path.rsplit('/').next().unwrap_or_default();
    let ours = path.contains("/limiter-common/") || path.contains("/limiter-ebpf/");
    match file {
        "packet.rs" if ours => "packet.rs: parsing",
        "xdp.rs" if path.contains("/aya-ebpf") => "packet.rs: parsing",
        "lease.rs" if ours => "lease.rs: this CPU's slot",
        "count.rs" | "reason.rs" if ours => "count.rs, reason.rs: counters, drop sample, verdict",
        "rules.rs" | "prefix.rs" if ours => "rules.rs, prefix.rs: class and key",
        "gcra.rs" if ours => "gcra.rs: clock and charge arithmetic",
        "program.rs" if ours => "program.rs: the entry point's own lines (bounds, policy, clock cache, cookie test)",
        "lib.rs" if ours => "lib.rs: limiter_common (key derive, stat index)",
        "state.rs" | "held.rs" if ours => "state.rs, held.rs: out-of-state TCP's judge, cache and socket lookup",
        "helpers.rs" | "array.rs" | "per_cpu_array.rs" if path.contains("/aya-ebpf") => "aya's map lookups (all maps)",
        _ if ours => "other files of the limiter",
        _ => "core library lines (integer, option, equality helpers)",
    }
}
