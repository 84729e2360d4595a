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
        crate::policy::compile::override_net(net, base.v4_prefix, base.v6_prefix).map_err(refuse)?;
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
