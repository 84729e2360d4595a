//! Request criticality, as classes and overrides carry it.

use serde::{Deserialize, Serialize};

/// How much a connection matters to the forwarder (seed 002's request
/// criticality): at `max_connections` and under adaptive throttling,
/// sheddable connections are refused first, and a share is kept for
/// critical ones.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Criticality {
    Sheddable,
    #[default]
    Default,
    Critical,
}

impl Criticality {
    pub const ALL: [Criticality; 3] = [Criticality::Critical, Criticality::Default, Criticality::Sheddable];

    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Criticality::Critical => "critical",
            Criticality::Default => "default",
            Criticality::Sheddable => "sheddable",
        }
    }
}
