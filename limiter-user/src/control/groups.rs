//! What the control protocol says of country and ASN groups: an
//! address's (`prefix show`) and each group's rates (`top`).

use serde::{Deserialize, Serialize};

/// What the groups' files say of an address, and which budget holds it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupShow {
    /// ISO 3166-1 alpha-2, from a file a group reads.
    pub country: Option<String>,
    pub asn: Option<u32>,
    /// The group its bucket prefix is in.
    pub group: Option<String>,
    /// The network of that group that decided: the most specific one
    /// holding the bucket prefix whole (the kernel's longest match).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<ipnet::IpNet>,
    /// Which budget holds it, in words.
    pub budget: String,
}

/// What a group passed and dropped in a second.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupRate {
    pub group: String,
    pub passed_per_sec: u64,
    pub dropped_per_sec: u64,
}
