//! Who decided something about a network: one table for every author of
//! a decision, as `limiter_common::reason` is for the verdicts. A row is
//! its label (what `prefix list`, its JSON, the log lines and the deny
//! set's origin names say), its rank (the order of the variants, highest
//! first: a lower one never replaces a higher one's decision) and its
//! layer's code in the pinned `RUNTIME` map.
//!
//! A decision a named section made (a feed, a group, a CrowdSec origin)
//! is a [`Named`] origin: the row and the name, written `LABEL:NAME` in
//! the deny set's pinned origin table and parsed where that is read.

use serde::{Deserialize, Serialize};

/// Who decided, highest rank first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Origin {
    /// An operator (`limiter prefix ...`, `limiter upstream ...`).
    #[serde(rename = "runtime")]
    Operator,
    /// An `[[override]]` of the policy file.
    #[serde(rename = "file")]
    File,
    /// A `[[source]]` file of networks the operator keeps (an allow list),
    /// read by its kind.
    #[serde(rename = "source")]
    Source,
    /// The tenant layer (`POST /v1/penalties`), under the governor.
    #[serde(rename = "feedback")]
    Feedback,
    /// The daemon's escalation of a proven source, under the same governor.
    #[serde(rename = "escalation")]
    Escalation,
    /// A CrowdSec decision in the deny set.
    #[serde(rename = "crowdsec")]
    Crowdsec,
    /// A `[[feed]]`'s blocklist in the deny set.
    #[serde(rename = "feed")]
    Feed,
    /// A `[[group]]` of countries or ASNs.
    #[serde(rename = "group")]
    Group,
    /// Link pressure: a network the program drops most while the link is
    /// full, announced upstream.
    #[serde(rename = "pressure")]
    Pressure,
}

impl Origin {
    /// Every origin, highest rank first.
    pub const ALL: [Origin; 9] = [
        Origin::Operator,
        Origin::File,
        Origin::Source,
        Origin::Feedback,
        Origin::Escalation,
        Origin::Crowdsec,
        Origin::Feed,
        Origin::Group,
        Origin::Pressure,
    ];

    /// Its label (`runtime` for the operator, as `prefix list` has always
    /// said).
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            Origin::Operator => "runtime",
            Origin::File => "file",
            Origin::Source => "source",
            Origin::Feedback => "feedback",
            Origin::Escalation => "escalation",
            Origin::Crowdsec => "crowdsec",
            Origin::Feed => "feed",
            Origin::Group => "group",
            Origin::Pressure => "pressure",
        }
    }

    /// The origin a label names.
    #[must_use]
    pub fn parse(label: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.label() == label)
    }

    /// Whether its decisions outrank `other`'s.
    #[must_use]
    pub fn outranks(self, other: Origin) -> bool {
        self < other
    }

    /// Automation under the governor (the tenant layer's feedback, the
    /// daemon's escalation), counted against its cap.
    #[must_use]
    pub const fn governed(self) -> bool {
        matches!(self, Origin::Feedback | Origin::Escalation)
    }

    /// Its layer's code in the pinned `RUNTIME` map's key (`pad[0]`): the
    /// operator's 0 (as records of builds before layers have), feedback 1,
    /// escalation 2; the others are never recorded there.
    #[must_use]
    pub const fn runtime_code(self) -> u8 {
        match self {
            Origin::Feedback => 1,
            Origin::Escalation => 2,
            _ => 0,
        }
    }
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.label())
    }
}

/// A decision's named author: a feed, a group, a CrowdSec origin
/// (`cscli`, `lists:NAME`, ...). Written `LABEL:NAME`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Named {
    pub by: Origin,
    pub name: String,
}

impl Named {
    /// The `[[feed]]` called `name`.
    #[must_use]
    pub fn feed(name: &str) -> Self {
        Self { by: Origin::Feed, name: name.to_owned() }
    }

    /// The `[[source]]` called `name`.
    #[must_use]
    pub fn source(name: &str) -> Self {
        Self { by: Origin::Source, name: name.to_owned() }
    }

    /// The `[[group]]` called `name`.
    #[must_use]
    pub fn group(name: &str) -> Self {
        Self { by: Origin::Group, name: name.to_owned() }
    }

    /// CrowdSec's origin `name` (`cscli`, `lists:NAME`, ...).
    #[must_use]
    pub fn crowdsec(name: &str) -> Self {
        Self { by: Origin::Crowdsec, name: name.to_owned() }
    }

    /// The named origin `text` (`LABEL:NAME`) writes, if it is one.
    #[must_use]
    pub fn parse(text: &str) -> Option<Self> {
        let (label, name) = text.split_once(':')?;
        let by = Origin::parse(label)?;
        Some(Self { by, name: name.to_owned() })
    }

    /// The name `text` holds if it writes one of `by`'s.
    #[must_use]
    pub fn name_in(text: &str, by: Origin) -> Option<&str> {
        text.strip_prefix(by.label())?.strip_prefix(':')
    }
}

impl std::fmt::Display for Named {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.by.label(), self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each label reads back as its origin, each named origin's text as
    /// itself; the ranks are the table's order.
    #[test]
    fn labels_and_names_read_back() {
        for (i, o) in Origin::ALL.into_iter().enumerate() {
            assert_eq!(Origin::parse(o.label()), Some(o));
            assert_eq!(serde_json::to_string(&o).unwrap(), format!("\"{}\"", o.label()));
            assert!(Origin::ALL[i + 1..].iter().all(|lower| o.outranks(*lower) && !lower.outranks(o)));
        }
        assert_eq!(Origin::parse("operator"), None);
        for n in [Named::feed("ops"), Named::source("office"), Named::group("eu"), Named::crowdsec("lists:x:y")] {
            assert_eq!(Named::parse(&n.to_string()), Some(n.clone()));
            assert_eq!(Named::name_in(&n.to_string(), n.by), Some(n.name.as_str()));
        }
        assert_eq!(Named::feed("ops").to_string(), "feed:ops");
        assert_eq!(Named::name_in("feeder:x", Origin::Feed), None);
        assert_eq!(Named::name_in("group:x", Origin::Feed), None);
        assert_eq!(Named::parse("nothing"), None);
    }
}
