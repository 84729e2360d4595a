//! The overrides in force as `prefix list` answers them: each network,
//! what is decided for it and by whom, and the layers beneath.

use serde::{Deserialize, Serialize};

use crate::{origin::Origin, policy::Action};

/// Who decided an entry of `prefix list` (an [`Origin`]), and whether
/// it is only listed (feedback's shadow mode: counted, not enforced). On
/// the wire and on screen, its label: the decider's (`runtime`, `file`,
/// `feedback`, `escalation`, `crowdsec`), with ` (shadow)` after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shown {
    pub by: Origin,
    pub shadow: bool,
}

const SHADOW: &str = " (shadow)";

impl Shown {
    /// `by`'s decision, in force.
    #[must_use]
    pub const fn of(by: Origin) -> Self {
        Self { by, shadow: false }
    }

    /// `by`'s decision in shadow mode.
    #[must_use]
    pub const fn shadow(by: Origin) -> Self {
        Self { by, shadow: true }
    }

    /// Decided by the tenant layer's feedback or the daemon's escalation
    /// (the penalties the tenant layer may list).
    #[must_use]
    pub const fn is_automation(self) -> bool {
        self.by.governed()
    }

    /// Its label.
    #[must_use]
    pub fn label(self) -> String {
        if self.shadow { format!("{}{SHADOW}", self.by.label()) } else { self.by.label().to_owned() }
    }

    /// The origin a label names.
    #[must_use]
    pub fn parse(label: &str) -> Option<Self> {
        let (name, shadow) = label.strip_suffix(SHADOW).map_or((label, false), |n| (n, true));
        let by = Origin::parse(name)?;
        Some(Self { by, shadow })
    }
}

impl From<Origin> for Shown {
    fn from(by: Origin) -> Self {
        Self::of(by)
    }
}

impl std::fmt::Display for Shown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(&self.label())
    }
}

impl PartialEq<&str> for Shown {
    fn eq(&self, other: &&str) -> bool {
        Self::parse(other) == Some(*self)
    }
}

impl Serialize for Shown {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.label())
    }
}

impl<'de> Deserialize<'de> for Shown {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let label = String::deserialize(d)?;
        Self::parse(&label).ok_or_else(|| serde::de::Error::custom(format!("unknown origin {label:?}")))
    }
}

/// The overrides in force, and the deny set's CrowdSec decisions (the
/// first [`MAX_LISTED_DECISIONS`] by network; `more` counts the rest).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrefixList {
    pub version: u64,
    pub entries: Vec<PrefixEntry>,
    /// CrowdSec decisions in force beyond those listed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub more: usize,
}

/// CrowdSec decisions one `prefix list` answer holds at most.
pub const MAX_LISTED_DECISIONS: usize = 10_000;

#[expect(clippy::trivially_copy_pass_by_ref, reason = "serde's skip_serializing_if signature")]
fn is_zero(n: &usize) -> bool {
    *n == 0
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrefixEntry {
    pub cidr: ipnet::IpNet,
    pub action: Action,
    pub rate: Option<u64>,
    pub burst: Option<u64>,
    pub origin: Shown,
    /// Seconds until a runtime override expires (`None`: never).
    #[serde(default)]
    pub expires_in_secs: Option<u64>,
    /// Why the tenant layer asked for it (feedback only).
    #[serde(default)]
    pub reason: Option<String>,
    /// The deny set's origin that decided it (`crowdsec:cscli`,
    /// `crowdsec:lists:NAME`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Every layer that decided something about this network, highest
    /// first, when more than one did (the fields above are the one in
    /// force).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<LayerEntry>,
}

/// One layer's decision about a network: the operator's (`runtime`), the
/// policy file's (`file`), or automation's (`feedback`, `escalation`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerEntry {
    pub layer: Shown,
    pub action: Action,
    pub rate: Option<u64>,
    pub burst: Option<u64>,
    /// Seconds until it expires (`None`: never).
    pub expires_in_secs: Option<u64>,
    /// Whether this layer is the one enforced.
    pub in_force: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The labels clients and the tenant layer read, one per decider and
    /// shadow, each read back as itself; an unknown one is refused.
    #[test]
    fn an_origin_is_its_label_on_the_wire() {
        let all = Origin::ALL;
        let labels: Vec<String> = all.iter().map(|d| Shown::of(*d).to_string()).collect();
        // The labels `prefix list` has always had, and the deny set's other origins.
        assert_eq!(
            labels,
            ["runtime", "file", "source", "feedback", "escalation", "crowdsec", "feed", "group", "pressure"]
        );
        assert_eq!(Shown::shadow(Origin::Feedback).to_string(), "feedback (shadow)");
        for d in all {
            for o in [Shown::of(d), Shown::shadow(d)] {
                let wire = serde_json::to_string(&o).unwrap();
                assert_eq!(wire, format!("\"{o}\""));
                assert_eq!(serde_json::from_str::<Shown>(&wire).unwrap(), o);
            }
            // The decider's own serde name is the same label.
            assert_eq!(serde_json::to_string(&d).unwrap(), format!("\"{}\"", d.label()));
        }
        assert!(serde_json::from_str::<Shown>("\"tenant\"").is_err());
        assert!(Shown::shadow(Origin::Escalation).is_automation() && !Shown::of(Origin::Crowdsec).is_automation());
    }
}
