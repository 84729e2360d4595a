//! A verifier refusal, summed up in one line: the function and instruction
//! it refused, the source line, and the kernel's reason, with the whole
//! log kept in a file the line names (a raw verifier dump is never the
//! only message).

use std::path::{Path, PathBuf};

use aya::programs::ProgramError;

use crate::dataplane::LoadError;

/// What the last lines of a verifier log say.
#[derive(Debug, PartialEq, Eq)]
pub struct Summary {
    /// The function being validated (`Validating NAME() func#N`), if the
    /// log names one.
    pub function: Option<String>,
    /// The last instruction walked: its index and text.
    pub instruction: Option<(u32, String)>,
    /// The source line of that instruction (the log's `; ...` line).
    pub source: Option<String>,
    /// The kernel's reason, its lines joined by "; ".
    pub reason: String,
}

impl Summary {
    /// Read the summary out of a verifier log.
    #[must_use]
    pub fn of(log: &str) -> Self {
        let lines: Vec<&str> = log.lines().map(str::trim_end).collect();
        let function = lines.iter().rev().find_map(|l| {
            let rest = l.strip_prefix("Validating ")?;
            Some(rest.split("()").next()?.to_owned())
        });
        // The last instruction line `N: (op) text ; state`.
        let last_insn = lines.iter().rposition(|l| insn(l).is_some());
        let instruction = last_insn.and_then(|i| insn(lines[i]));
        let source = last_insn.and_then(|i| {
            lines[..i]
                .iter()
                .rev()
                .take(8)
                .find_map(|l| l.strip_prefix("; ").map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned))
        });
        let after = last_insn.map_or(0, |i| i + 1);
        let reason: Vec<&str> = lines[after..]
            .iter()
            .copied()
            .filter(|l| {
                !l.is_empty()
                    && !l.starts_with("processed ")
                    && !l.starts_with("verification time")
                    && !l.starts_with("stack depth")
                    && !l.starts_with("; ")
                    && !l.starts_with("Func#")
            })
            .collect();
        let reason = if reason.is_empty() { "no reason in the log".to_owned() } else { reason.join("; ") };
        Self { function, instruction, source, reason }
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(func) = &self.function {
            write!(f, "in {func}")?;
        }
        if let Some((n, text)) = &self.instruction {
            write!(f, "{}at instruction {n} ({text})", if self.function.is_some() { ", " } else { "" })?;
        }
        if let Some(src) = &self.source {
            write!(f, ", source `{src}`")?;
        }
        if self.function.is_some() || self.instruction.is_some() {
            f.write_str(": ")?;
        }
        f.write_str(&self.reason)
    }
}

/// `N: (op) text ; state` -> (N, text).
fn insn(l: &str) -> Option<(u32, String)> {
    let (n, rest) = l.split_once(": (")?;
    let n: u32 = n.parse().ok()?;
    let (_, text) = rest.split_once(") ")?;
    let text = text.split(" ; ").next().unwrap_or(text).trim();
    // A branch's state dump follows the target on the same line.
    let text = text.split("  ").next().unwrap_or(text).trim();
    Some((n, text.to_owned()))
}

/// Where a refused program's whole log goes: the service's runtime
/// directory (`/run/limiter` under systemd), else the system's temporary
/// directory.
#[must_use]
pub fn log_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("RUNTIME_DIRECTORY") {
        // systemd may list several, separated by ':'.
        let first = d.to_string_lossy().split(':').next().unwrap_or_default().to_owned();
        if !first.is_empty() {
            return PathBuf::from(first);
        }
    }
    let run = Path::new("/run/limiter");
    if std::fs::create_dir_all(run).is_ok() {
        return run.to_path_buf();
    }
    std::env::temp_dir()
}

/// Keep `log` in `dir` as `verifier-PROGRAM.log`; the path, if written.
#[must_use]
pub fn keep(dir: &Path, program: &str, log: &str) -> Option<PathBuf> {
    let path = dir.join(format!("verifier-{program}.log"));
    std::fs::write(&path, log).ok().map(|()| path)
}

/// A load's error: a verifier refusal summed up (its log kept), or as it
/// came.
pub(crate) fn verify_error(name: &'static str, source: ProgramError) -> LoadError {
    match source {
        ProgramError::LoadError { io_error, verifier_log } => {
            let text = format!("{verifier_log:?}");
            let summary = Summary::of(&text).to_string();
            let log = keep(&log_dir(), name, &text);
            LoadError::Refused { name, release: super::release(), summary, log, source: io_error }
        }
        source => LoadError::Verify { name, source },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The end of Debian 12's (6.1) log refusing 394d35c's program.
    const BOUNDS: &str = "\
Func#3 is safe for any args that match its prototype
Validating limiter_charge_bucket() func#4...
3817: (79) r1 = *(u64 *)(r10 -104)    ; R1_w=scalar(umax=255,var_off=(0x0; 0xff)) R10=fp0
3818: (67) r1 <<= 5                   ; R1_w=scalar(umax=8160,var_off=(0x0; 0x1fe0))
; cfg.classes.get(class)
3819: (79) r5 = *(u64 *)(r10 -56)     ; R5_w=map_value(off=0,ks=4,vs=544,imm=0) R10=fp0
; self.slices != 0
3842: (61) r1 = *(u32 *)(r5 +24)
invalid access to map value, value_size=544 off=8256 size=4
R5 max value is outside of the allowed memory range
processed 11003 insns (limit 1000000) max_states_per_insn 19 total_states 574 peak_states 200 mark_read 20
";

    /// The end of 6.1's log when the window's sum branched a slot.
    const TOO_LARGE: &str = "\
Validating limiter_charge_window() func#9...
8671: R1=scalar() R2=scalar() R3=scalar() R4=scalar() R5=scalar() R10=fp0
; if age < slices as u64 || (age == slices as u64 && first(slot) > at) { count(slot) } else { 0 }
8925: (2d) if r6 > r3 goto pc+6 8932: R0=scalar() R1=scalar(id=63080) R2=scalar(umax=1048575,var_off=(0x0; 0xfffff))
; slot & COUNT_MASK
8932: (67) r1 <<= 32
BPF program is too large. Processed 1000001 insn
verification time 48228679 usec
stack depth 0+0+64+16+216+56+0+56+144+216+0+0+0+0+0
processed 1000001 insns (limit 1000000) max_states_per_insn 59 total_states 43895 peak_states 3190 mark_read 83
";

    #[test]
    fn a_bounds_refusal_names_the_function_the_instruction_its_source_and_the_reason() {
        let s = Summary::of(BOUNDS);
        assert_eq!(s.function.as_deref(), Some("limiter_charge_bucket"));
        assert_eq!(s.instruction, Some((3842, "r1 = *(u32 *)(r5 +24)".to_owned())));
        assert_eq!(s.source.as_deref(), Some("self.slices != 0"));
        assert_eq!(
            s.reason,
            "invalid access to map value, value_size=544 off=8256 size=4; R5 max value is outside of the allowed memory range"
        );
        let line = s.to_string();
        assert!(!line.contains('\n'), "{line}");
        assert!(line.starts_with("in limiter_charge_bucket, at instruction 3842"), "{line}");
    }

    #[test]
    fn a_program_too_large_is_named_with_where_the_verifier_stopped() {
        let s = Summary::of(TOO_LARGE);
        assert_eq!(s.function.as_deref(), Some("limiter_charge_window"));
        assert_eq!(s.instruction, Some((8932, "r1 <<= 32".to_owned())));
        assert_eq!(s.source.as_deref(), Some("slot & COUNT_MASK"));
        assert_eq!(s.reason, "BPF program is too large. Processed 1000001 insn");
    }

    #[test]
    fn an_empty_log_still_gives_a_line() {
        let s = Summary::of("");
        assert_eq!(s.to_string(), "no reason in the log");
    }

    #[test]
    fn the_log_is_kept_whole_where_the_line_says() {
        let dir = std::env::temp_dir().join(format!("limiter-refusal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = keep(&dir, "limiter", BOUNDS).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), BOUNDS);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
