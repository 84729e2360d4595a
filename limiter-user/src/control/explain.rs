//! `limiter explain ADDR`: the verdict a packet from an address would get
//! now, and every layer the data plane asks on the way, in its order.
//!
//! The JSON (`-j`) is one object: `address`, `protocol`, `port`, `syn`
//! (what was asked), `version` (the policy's), `cidr` (the bucket prefix),
//! `verdict` (`pass`, `drop` or `shadow_drop`, as the metrics spell it),
//! `reason` (the counter's reason label: `allowed`, `denied`,
//! `rate_limited`, `admitted`, ...), `decided_by` (the layer that decides)
//! and `layers`: one object per layer in the data plane's order, each
//! with `layer` (`class`, `syn_cookies`, `override`, `group`, `deny_set`,
//! `bucket`, `window`, `tcp_state`, `upstream`), `state` (false: nothing holds this
//! address there), `decides`, `says` (one line for people) and
//! `detail` (the layer's own fields, as `docs/operations.md` lists them).

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::policy::Protocol;

/// The answer to `limiter explain`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Explain {
    pub address: IpAddr,
    pub protocol: Protocol,
    pub port: Option<u16>,
    pub syn: bool,
    pub version: u64,
    pub cidr: IpNet,
    pub verdict: String,
    pub reason: String,
    pub decided_by: String,
    pub layers: Vec<Layer>,
}

/// One layer the data plane asks, and what it says of the address.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Layer {
    pub layer: String,
    /// Whether anything holds the address at this layer.
    pub state: bool,
    /// Whether this layer decides the verdict.
    pub decides: bool,
    pub says: String,
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub detail: serde_json::Value,
}

impl Layer {
    /// A layer with nothing for the address.
    #[must_use]
    pub fn nothing(layer: &str, says: impl Into<String>) -> Self {
        Self {
            layer: layer.to_owned(),
            state: false,
            decides: false,
            says: says.into(),
            detail: serde_json::Value::Null,
        }
    }

    /// A layer holding the address: it `says`, with `detail`.
    #[must_use]
    pub fn holds(layer: &str, says: impl Into<String>, detail: serde_json::Value) -> Self {
        Self { layer: layer.to_owned(), state: true, decides: false, says: says.into(), detail }
    }
}
