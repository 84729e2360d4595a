//! Durations as the policy file writes them: `"250ms"`, `"2s"`, `"10m"`,
//! `"1h"`, read and written back.

use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// A duration that is not one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("{0:?} is not a duration like \"250ms\", \"2s\", \"10m\"")]
    NotADuration(String),
    #[error("{0:?}: the unit must be ms, s, m or h")]
    Unit(String),
}

/// `"250ms"`, `"2s"`, `"10m"`, `"1h"`.
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().map_err(|_| DurationError::NotADuration(s.to_owned()))?;
    let d = match unit.trim() {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        _ => return Err(DurationError::Unit(s.to_owned())),
    };
    Ok(d)
}

pub(crate) fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    parse_duration(&s).map_err(serde::de::Error::custom)
}

/// A duration as the file spells it, in the largest unit that keeps it
/// exact (`"10m"`, `"1500ms"`): what [`parse_duration`] reads back.
#[must_use]
pub fn spell_duration(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        0 => "0ms".into(),
        _ if ms.is_multiple_of(3_600_000) => format!("{}h", ms / 3_600_000),
        _ if ms.is_multiple_of(60_000) => format!("{}m", ms / 60_000),
        _ if ms.is_multiple_of(1000) => format!("{}s", ms / 1000),
        _ => format!("{ms}ms"),
    }
}

/// Writes a duration field (`#[serde(serialize_with = "duration_out")]`).
pub(crate) fn duration_out<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&spell_duration(*d))
}

/// Writes an optional duration field (skipped when `None`).
#[expect(clippy::ref_option, reason = "serde's serialize_with passes a reference")]
pub(crate) fn duration_opt_out<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => duration_out(d, s),
        None => s.serialize_none(),
    }
}

/// An optional duration field (`#[serde(default, deserialize_with =
/// "duration_opt")]`).
pub(crate) fn duration_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    duration(d).map(Some)
}
