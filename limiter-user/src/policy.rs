//! The policy the data plane enforces, its validation, and the built-in
//! default that applies when no policy file is given.

use limiter_common::{Config, cost, gcra};

/// What one admitted packet costs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CostUnit {
    /// One unit per packet.
    Packets,
    /// The frame length in bytes.
    Bytes,
}

impl CostUnit {
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Packets => "packets",
            Self::Bytes => "bytes",
        }
    }
}

/// A complete policy. [`Policy::default`] is the built-in one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Units per second per prefix.
    pub rate: u64,
    /// Bucket depth in units.
    pub burst: u64,
    pub cost: CostUnit,
    pub v4_prefix: u32,
    pub v6_prefix: u32,
    /// Tracked prefixes (LRU capacity of the bucket map).
    pub capacity: u32,
}

impl Default for Policy {
    /// 1,000 packets/s with a burst of 2,000 per IPv4 /24 and IPv6 /56,
    /// 262,144 tracked prefixes: generous for any one well-behaved network
    /// in front of a TLS edge, far below what a flood sends.
    fn default() -> Self {
        Self {
            rate: 1_000,
            burst: 2_000,
            cost: CostUnit::Packets,
            v4_prefix: 24,
            v6_prefix: 56,
            capacity: limiter_common::maps::DEFAULT_BUCKET_CAPACITY,
        }
    }
}

/// Smallest byte burst: a bucket must hold one full-size Ethernet frame.
pub const MIN_BYTE_BURST: u64 = 1_518;

/// Why a policy was refused; `field` names the offending setting.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{field}: {problem}")]
pub struct PolicyError {
    pub field: &'static str,
    pub problem: String,
}

fn bad(field: &'static str, problem: impl Into<String>) -> PolicyError {
    PolicyError {
        field,
        problem: problem.into(),
    }
}

impl Policy {
    /// Check every field and derive the data-plane config.
    pub fn to_config(&self) -> Result<Config, PolicyError> {
        let Self {
            rate,
            burst,
            cost,
            v4_prefix,
            v6_prefix,
            capacity,
        } = *self;
        if !(1..=gcra::MAX_RATE).contains(&rate) {
            return Err(bad(
                "rate",
                format!("{rate} is outside 1..={}", gcra::MAX_RATE),
            ));
        }
        let min_burst = match cost {
            CostUnit::Packets => 1,
            CostUnit::Bytes => MIN_BYTE_BURST,
        };
        if burst < min_burst {
            let unit = cost.label();
            return Err(bad(
                "burst",
                format!("{burst} is below {min_burst}, the least a bucket of {unit} must hold"),
            ));
        }
        if v4_prefix > 32 {
            return Err(bad("v4_prefix", format!("{v4_prefix} is longer than 32")));
        }
        if v6_prefix > 128 {
            return Err(bad("v6_prefix", format!("{v6_prefix} is longer than 128")));
        }
        if capacity == 0 {
            return Err(bad("capacity", "must be at least 1"));
        }
        let unit = match cost {
            CostUnit::Packets => cost::PACKETS,
            CostUnit::Bytes => cost::BYTES,
        };
        Config::new(rate, burst, unit, v4_prefix, v6_prefix)
            .ok_or_else(|| bad("burst", format!("{burst} is too large for rate {rate}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_policy_is_valid() {
        let c = Policy::default().to_config().unwrap();
        // 1 ms per packet and 2 s of burst, in 1/16 ns.
        assert_eq!(c.unit, 16_000_000);
        assert_eq!(c.tau, 32_000_000_000);
    }

    #[test]
    fn each_bad_field_is_named() {
        let d = Policy::default();
        let cases = [
            (
                Policy {
                    rate: 0,
                    ..d.clone()
                },
                "rate",
            ),
            (
                Policy {
                    rate: gcra::MAX_RATE + 1,
                    ..d.clone()
                },
                "rate",
            ),
            (
                Policy {
                    burst: 0,
                    ..d.clone()
                },
                "burst",
            ),
            (
                Policy {
                    cost: CostUnit::Bytes,
                    burst: 1000,
                    ..d.clone()
                },
                "burst",
            ),
            (
                Policy {
                    v4_prefix: 33,
                    ..d.clone()
                },
                "v4_prefix",
            ),
            (
                Policy {
                    v6_prefix: 129,
                    ..d.clone()
                },
                "v6_prefix",
            ),
            (Policy { capacity: 0, ..d }, "capacity"),
        ];
        for (p, field) in cases {
            assert_eq!(p.to_config().unwrap_err().field, field, "{p:?}");
        }
    }
}
