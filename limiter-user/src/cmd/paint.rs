//! Colour, as `ls` and `ip -c` do it: only where people read (standard
//! output a terminal, no `-j`), never with `NO_COLOR` set (no-color.org)
//! or `TERM=dumb`, and as `--color=auto|always|never` says. Red marks
//! what is wrong or dropped, yellow what only shadow mode let through,
//! green what passes.

use std::sync::atomic::{AtomicBool, Ordering};

/// Whether this process colours its output (decided once, at start).
static ON: AtomicBool = AtomicBool::new(false);

pub use crate::cli::ColorChoice as Choice;

/// Whether to colour, from the choice, `-j`, whether standard output is
/// a terminal, and the values of `NO_COLOR` and `TERM`.
#[must_use]
pub fn decide(choice: Choice, json: bool, tty: bool, no_color: Option<&str>, term: Option<&str>) -> bool {
    !json
        && match choice {
            Choice::Always => true,
            Choice::Never => false,
            Choice::Auto => tty && no_color.is_none_or(str::is_empty) && term != Some("dumb"),
        }
}

/// Decide for this process.
pub fn init(choice: Choice, json: bool) {
    use std::io::IsTerminal as _;
    let var = |k| std::env::var(k).ok();
    let on = decide(choice, json, std::io::stdout().is_terminal(), var("NO_COLOR").as_deref(), var("TERM").as_deref());
    ON.store(on, Ordering::Relaxed);
}

fn paint(code: &str, text: &str) -> String {
    if ON.load(Ordering::Relaxed) { format!("\x1b[{code}m{text}\x1b[0m") } else { text.to_owned() }
}

/// What is wrong, or dropped.
#[must_use]
pub fn red(text: &str) -> String {
    paint("31", text)
}

/// What only shadow mode let through.
#[must_use]
pub fn yellow(text: &str) -> String {
    paint("33", text)
}

/// What passes.
#[must_use]
pub fn green(text: &str) -> String {
    paint("32", text)
}

/// A verdict's word in its colour: `drop`, `shadow_drop`, `pass`.
#[must_use]
pub fn verdict(word: &str) -> String {
    match word {
        "drop" => red(word),
        "shadow_drop" => yellow(word),
        "pass" => green(word),
        w => w.to_owned(),
    }
}

/// The columns `text` takes on a terminal: its characters but those of
/// colour codes.
#[must_use]
pub fn width(text: &str) -> usize {
    let (mut n, mut in_code) = (0, false);
    for c in text.chars() {
        match (in_code, c) {
            (false, '\x1b') => in_code = true,
            (true, 'm') => in_code = false,
            (true, _) => {}
            (false, _) => n += 1,
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_where_people_read_and_never_against_no_color() {
        assert!(decide(Choice::Auto, false, true, None, Some("xterm-256color")));
        assert!(!decide(Choice::Auto, false, false, None, None), "a pipe");
        assert!(!decide(Choice::Auto, false, true, Some("1"), None), "NO_COLOR");
        assert!(decide(Choice::Auto, false, true, Some(""), None), "NO_COLOR empty counts as unset");
        assert!(!decide(Choice::Auto, false, true, None, Some("dumb")));
        assert!(decide(Choice::Always, false, false, Some("1"), None), "always means always");
        assert!(!decide(Choice::Never, false, true, None, None));
        assert!(!decide(Choice::Always, true, true, None, None), "JSON is never coloured");
    }

    #[test]
    fn a_coloured_cell_is_as_wide_as_its_text() {
        assert_eq!(width("\x1b[31mdrop\x1b[0m"), 4);
        assert_eq!(width("198.18.7.0/24"), 13);
    }
}
