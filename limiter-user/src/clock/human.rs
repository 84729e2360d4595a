//! Times and durations as people read them in a table or a status line
//! (`-j` keeps the raw numbers): a duration in its two largest units
//! (`3h59m`, `2d4h`, `12m05s`, `45s`), a moment as the UTC clock and how
//! long ago it was (`22:16:03 UTC (2m05s ago)`, with the date when it is
//! not today's).

/// `secs` in its two largest units.
#[must_use]
pub fn duration(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) if s == 0 => format!("{m}m"),
        (0, 0, _) => format!("{m}m{s:02}s"),
        (0, _, 0) => format!("{h}h"),
        (0, _, _) => format!("{h}h{m:02}m"),
        (_, 0, _) => format!("{d}d"),
        _ => format!("{d}d{h}h"),
    }
}

/// Unix time `at` as the UTC clock: `HH:MM:SS`.
#[must_use]
pub fn clock(at: u64) -> String {
    format!("{:02}:{:02}:{:02}", at / 3600 % 24, at / 60 % 60, at % 60)
}

/// Unix time `at` as the UTC clock, with the date unless it is `now`'s
/// day, and how long before `now` it was (or `in ...` if after).
#[must_use]
pub fn when(at: u64, now: u64) -> String {
    let clock = format!("{} UTC", clock(at));
    let day = if at / 86_400 == now / 86_400 {
        String::new()
    } else {
        let (y, m, d) = civil(at / 86_400);
        format!("{y:04}-{m:02}-{d:02} ")
    };
    let rel = if at <= now { format!("{} ago", duration(now - at)) } else { format!("in {}", duration(at - now)) };
    format!("{day}{clock} ({rel})")
}

/// The proleptic Gregorian date of day `days` since 1970-01-01 (Howard
/// Hinnant's `civil_from_days`).
fn civil(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_in_two_units() {
        let cases = [
            (0, "0s"),
            (45, "45s"),
            (60, "1m"),
            (725, "12m05s"),
            (3600, "1h"),
            (14_352, "3h59m"),
            (86_400, "1d"),
            (86_400 + 3 * 60, "1d"),
            (2 * 86_400 + 4 * 3600 + 59, "2d4h"),
        ];
        for (secs, text) in cases {
            assert_eq!(duration(secs), text, "{secs}");
        }
    }

    #[test]
    fn moments_read_as_the_utc_clock_and_how_long_ago() {
        // 2026-12-04 22:16:03 UTC is 1_796_422_563 (date -u -d @1796422563).
        let at = 1_796_422_563;
        assert_eq!(when(at, at + 125), "22:16:03 UTC (2m05s ago)");
        assert_eq!(when(at, at + 86_400), "2026-12-04 22:16:03 UTC (1d ago)");
        assert_eq!(when(at + 60, at), "22:17:03 UTC (in 1m)");
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(civil(11_016), (2000, 2, 29));
    }
}
