//! `limiter prefix show ADDR`: the bucket prefix the address falls in,
//! and what each feature says of it (the fleet's window quotas; the
//! country and ASN groups next), each through `Feature::show`.

use std::net::IpAddr;

use ipnet::IpNet;
use limiter_common::{family, packet, rules};

use super::{features::Features, view::View};
use crate::control::PrefixShow;
use crate::engine::Enforcer;

/// Why `limiter prefix show` has no answer.
#[derive(Debug, thiserror::Error)]
pub(super) enum ShowError {
    #[error("a policy change is running; ask again")]
    Changing,
    #[error("no policy applied yet")]
    NoPolicy,
    #[error("{net} is wider than a bucket prefix (/{bucket}): give one address or a /{bucket}")]
    Wider { net: IpNet, bucket: u32 },
}

/// `limiter prefix show`: the bucket prefix that `net` (an address or a
/// network no wider than a bucket) falls in under the policy state
/// `policy` (`None`: a change has it away), and what the features say of
/// it.
pub(super) fn prefix_show(
    policy: Option<&Enforcer>,
    view: &View,
    features: &Features,
    net: IpNet,
) -> Result<PrefixShow, ShowError> {
    let p = policy.ok_or(ShowError::Changing)?;
    let config = p.config().ok_or(ShowError::NoPolicy)?;
    let bucket = if net.addr().is_ipv4() { config.v4_prefix } else { config.v6_prefix };
    if u32::from(net.prefix_len()) < bucket {
        return Err(ShowError::Wider { net, bucket });
    }
    let src = source_of(net.addr());
    // Every class's bucket of `src` covers the same network.
    let cidr = crate::dataplane::net(&rules::bucket_key(&src, config.v4_prefix, config.v6_prefix, 0));
    let mut out = PrefixShow { cidr, windows: Vec::new(), group: None, upstream: Vec::new() };
    let effective = p.effective(p.base());
    features.show(&src, &view.applied(p, &effective), &mut out);
    Ok(out)
}

/// A packet source of `addr`, as the data plane parses one.
pub(super) fn source_of(addr: IpAddr) -> packet::Source {
    let mut src = packet::Source::default();
    match addr {
        IpAddr::V4(a) => {
            src.family = family::IPV4;
            src.addr[0] = u32::from_ne_bytes(a.octets());
        }
        IpAddr::V6(a) => {
            src.family = family::IPV6;
            let o = a.octets();
            src.addr =
                std::array::from_fn(|i| u32::from_ne_bytes([o[i * 4], o[i * 4 + 1], o[i * 4 + 2], o[i * 4 + 3]]));
        }
    }
    src
}
