//! What each failed test said, printed again after a tier's summary: the harness prints a failure's output in the middle of a long
//! run, and a reader of the run's last lines (a CI log's tail) would see
//! only that it failed, never why.

/// Lines kept of one failure's output: its last ones, where the panic
/// and its message are.
const KEEP: usize = 12;
/// Characters kept of one line.
const WIDTH: usize = 300;

/// The failures' output, read from `cargo test`'s.
#[derive(Default)]
pub struct Digest {
    /// Each failed test's name and its output's last [`KEEP`] lines.
    failures: Vec<(String, Vec<String>)>,
    /// Inside a failure's output (between `---- NAME stdout ----` and the
    /// next such line or the harness's `failures:`).
    open: bool,
}

impl Digest {
    /// Take one line of `cargo test`'s output.
    pub fn line(&mut self, l: &str) {
        if let Some(name) = l.strip_prefix("---- ").and_then(|r| r.strip_suffix(" stdout ----")) {
            self.failures.push((name.to_owned(), Vec::new()));
            self.open = true;
        } else if l == "failures:" || l.starts_with("test result: ") || l.starts_with("stack backtrace:") {
            // A backtrace (RUST_BACKTRACE set) is after the panic's
            // message and says less than it: left out.
            self.open = false;
        } else if self.open
            && let Some((_, lines)) = self.failures.last_mut()
            && !l.trim().is_empty()
        {
            if lines.len() == KEEP {
                lines.remove(0);
            }
            lines.push(l.chars().take(WIDTH).collect());
        }
    }

    /// Add `other`'s failures after these.
    pub fn append(&mut self, other: Digest) {
        self.failures.extend(other.failures);
    }

    /// Print each failure's name and its last lines, each line after
    /// `tag`; nothing when none failed.
    pub fn print(&self, tag: &str) {
        for (name, lines) in &self.failures {
            println!("{tag}: failed: {name}");
            for l in lines {
                println!("{tag}:   {l}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failure_keeps_its_last_lines_and_nothing_else_is_kept() {
        let mut d = Digest::default();
        d.line("test a::passes ... ok");
        d.line("failures:");
        d.line("");
        d.line("---- a::fails stdout ----");
        for i in 0..20 {
            d.line(&format!("line {i}"));
        }
        d.line("thread 'a::fails' panicked at tests/a.rs:3:5:");
        d.line("assertion failed: 1 == 2");
        d.line("stack backtrace:");
        d.line("   0: __rustc::rust_begin_unwind");
        d.line("");
        d.line("---- b::also stdout ----");
        d.line("said");
        d.line("");
        d.line("failures:");
        d.line("    a::fails");
        d.line("test result: FAILED. 1 passed; 2 failed");
        assert_eq!(d.failures.len(), 2);
        let (name, lines) = &d.failures[0];
        assert_eq!(name, "a::fails");
        assert_eq!(lines.len(), KEEP);
        assert_eq!(lines.last().map(String::as_str), Some("assertion failed: 1 == 2"));
        assert_eq!(lines[0], "line 10");
        assert_eq!(d.failures[1], ("b::also".to_owned(), vec!["said".to_owned()]));
    }
}
