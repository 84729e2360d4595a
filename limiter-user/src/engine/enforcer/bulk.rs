//! A bulk load: many operator overrides as one change.

use std::collections::HashSet;

use ipnet::IpNet;

use super::{ApplyError, Origin, RuntimeEntry, layers::EntryWrite};
use crate::clock::unix_now;
use crate::policy::{OverrideAction, Policy};

/// The operator's entries setting `action` on every CIDR of `cidrs` under
/// `base`, or the first bad entry, refused with its index.
pub(super) fn changes(
    base: &Policy,
    cidrs: &[IpNet],
    action: OverrideAction,
    ttl: Option<u64>,
) -> Result<Vec<EntryWrite>, ApplyError> {
    let expires = ttl.map(|t| unix_now() + t);
    let mut changes = Vec::with_capacity(cidrs.len());
    let mut seen = HashSet::with_capacity(cidrs.len());
    for (index, &net) in cidrs.iter().enumerate() {
        let refuse = |message: String| ApplyError::Entry { index, message };
        if net.trunc() != net {
            return Err(refuse(format!("{net} has host bits set (did you mean {}?)", net.trunc())));
        }
        let bucket = if net.addr().is_ipv4() { base.v4_prefix } else { base.v6_prefix };
        if u32::from(net.prefix_len()) > bucket {
            return Err(refuse(format!("{net} is longer than the bucket prefix /{bucket}")));
        }
        if !seen.insert(net) {
            return Err(refuse(format!("{net} is listed twice")));
        }
        changes.push((
            (net, Origin::Operator),
            Some(RuntimeEntry { action: Some(action), expires, by: Origin::Operator }),
        ));
    }
    Ok(changes)
}
