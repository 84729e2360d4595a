//! Go's `time.Duration` text (`3h59m58.760265021s`, `1m30s`, `500ms`), as
//! the LAPI writes a decision's time left.

use std::time::Duration;

/// The duration `text` spells, or `None` for a negative one (expired) or
/// text that is not one.
#[must_use]
pub fn parse_go_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    if text.starts_with('-') || text.is_empty() {
        return None;
    }
    let text = text.strip_prefix('+').unwrap_or(text);
    if text == "0" {
        return Some(Duration::ZERO);
    }
    let (mut total, mut rest) = (0f64, text);
    while !rest.is_empty() {
        let n = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let value: f64 = rest[..n].parse().ok()?;
        rest = &rest[n..];
        let u = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let scale = match &rest[..u] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" | "μs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        rest = &rest[u..];
        total += value * scale;
    }
    Duration::try_from_secs_f64(total).ok()
}
