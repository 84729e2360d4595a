//! Why a packet got its verdict. Every reason has exactly one verdict and
//! its own counter slot in `STATS`.

/// What the XDP program returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Drop,
    /// Answered from XDP out of the interface it came in on (`XDP_TX`):
    /// a SYN cookie's SYN-ACK. The packet itself does not reach the stack.
    Tx,
}

impl Verdict {
    /// `pass`, `drop` or `tx`.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Drop => "drop",
            Verdict::Tx => "tx",
        }
    }
}

/// What a reason means to an operator: passed, dropped, or passed although
/// it would have been dropped (shadow mode). The one place this category
/// is decided: per-class counters in the kernel, metrics labels, the status
/// line and `limiter stats` all read it from [`Reason::action`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Pass,
    Drop,
    ShadowDrop,
}

impl Action {
    /// All actions, in label order.
    pub const ALL: [Action; 3] = [Action::Pass, Action::Drop, Action::ShadowDrop];

    /// `pass`, `drop` or `shadow_drop` (the metrics label).
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            Action::Pass => "pass",
            Action::Drop => "drop",
            Action::ShadowDrop => "shadow_drop",
        }
    }
}

macro_rules! reasons {
    ($( $(#[doc = $doc:literal])* $name:ident = $val:literal => $verdict:ident, $label:literal; )*) => {
        /// Index into `STATS`. The discriminants are the ABI.
        #[repr(u32)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Reason {
            $( $(#[doc = $doc])* $name = $val, )*
        }

        impl Reason {
            /// All reasons, in counter-slot order.
            pub const ALL: [Reason; REASON_COUNT] = [$(Reason::$name,)*];

            /// The one verdict this reason always gets.
            #[must_use]
            pub const fn verdict(self) -> Verdict {
                match self { $(Reason::$name => Verdict::$verdict,)* }
            }

            /// Stable snake-case name for logs, metrics labels and tables.
            #[must_use]
            pub const fn label(self) -> &'static str {
                match self { $(Reason::$name => $label,)* }
            }
        }
    };
}

reasons! {
    /// IPv4/IPv6 packet charged to its prefix's bucket and admitted.
    Admitted = 0 => Pass, "admitted";
    /// The prefix's bucket had less credit than the packet's cost.
    RateLimited = 1 => Drop, "rate_limited";
    /// Not IPv4 or IPv6 (ARP, LLDP, MPLS, ...): not ours to limit.
    NonIp = 2 => Pass, "non_ip";
    /// No policy has been written to `CONFIG` yet (fail open).
    NoConfig = 3 => Pass, "no_config";
    /// A new prefix's bucket could not be inserted (fail open, counted).
    BucketInsertFailed = 4 => Pass, "bucket_insert_failed";
    /// Compare-and-swap on the bucket lost `MAX_CAS_RETRIES` races in a row
    /// (other CPUs were charging the same prefix): drop, as floods do this.
    Contended = 5 => Drop, "contended";
    /// Frame shorter than an Ethernet header.
    EthTruncated = 6 => Drop, "eth_truncated";
    /// A VLAN tag announced but cut short.
    VlanTruncated = 7 => Drop, "vlan_truncated";
    /// More than `MAX_VLAN_DEPTH` stacked VLAN tags.
    VlanDepthExceeded = 8 => Drop, "vlan_depth_exceeded";
    /// IPv4 header (or its options) cut short.
    Ipv4Truncated = 9 => Drop, "ipv4_truncated";
    /// IPv4 IHL below 5, or version field not 4.
    Ipv4BadHeader = 10 => Drop, "ipv4_bad_header";
    /// IPv6 fixed header cut short.
    Ipv6Truncated = 11 => Drop, "ipv6_truncated";
    /// An IPv6 extension header cut short.
    Ipv6ExtTruncated = 12 => Drop, "ipv6_ext_truncated";
    /// More than `MAX_IPV6_EXT_HEADERS` extension headers.
    Ipv6ExtLimit = 13 => Drop, "ipv6_ext_limit";
    /// TCP or UDP header of a first (or unfragmented) packet cut short.
    L4Truncated = 14 => Drop, "l4_truncated";
    /// IPv6 EtherType but the version field is not 6.
    Ipv6BadHeader = 15 => Drop, "ipv6_bad_header";
    /// Would have been `rate_limited`, but its class is in shadow mode.
    ShadowDropped = 16 => Pass, "shadow_dropped";
    /// The source matches an `allow` override: never limited.
    Allowed = 17 => Pass, "allowed";
    /// The source matches a `deny` override: always dropped.
    Denied = 18 => Drop, "denied";
    /// The prefix has no bucket and the shared new-source budget is spent:
    /// dropped without creating one.
    NewSourceLimited = 19 => Drop, "new_source_limited";
    /// The prefix's own bucket admitted it, but its aggregate (coarser)
    /// prefix's bucket did not; the fine charge was refunded.
    AggregateLimited = 20 => Drop, "aggregate_limited";
    /// A SYN from a prefix without a bucket, to a class whose SYN cookies
    /// are engaged: answered from XDP with a cookie SYN-ACK, nothing
    /// stored (counted with the SYN-ACK's length).
    SynCookieSent = 21 => Tx, "syn_cookie_sent";
    /// Such a SYN handed to the kernel instead, one a second per port and
    /// family, so that the listener keeps accepting cookie ACKs (the
    /// kernel answers it with its own cookie and stores nothing).
    SynCookieToKernel = 22 => Pass, "syn_cookie_to_kernel";
    /// An ACK whose cookie the kernel's helper accepted: the source proved
    /// its address and its prefix got a bucket, budget or not.
    SynCookieVerified = 23 => Pass, "syn_cookie_verified";
    /// A TCP segment other than a plain SYN from a prefix without a
    /// bucket, while cookies are engaged, that carries no valid cookie (an
    /// ACK with a wrong one, a RST, a FIN, no flags): only a verified
    /// cookie gives such a prefix a bucket.
    SynCookieInvalid = 24 => Drop, "syn_cookie_invalid";
    /// A TCP header no stack accepts: SYN with RST, SYN with FIN, or a
    /// data offset under 5 words. Never charged, so it never makes a
    /// bucket nor spends the new-source budget.
    TcpBadFlags = 25 => Drop, "tcp_bad_flags";
    /// The prefix's own bucket admitted it, but its country or ASN
    /// group's shared budget did not; the prefix's charge was refunded.
    GroupLimited = 26 => Drop, "group_limited";
    /// A UDP packet its budget refused, of a class that takes source
    /// ports (a reflection class), that answers a socket this host
    /// connected to its source address and port: passed, uncharged (a
    /// flood from this host's own resolver does not cost it its answers).
    OwnAnswer = 27 => Pass, "own_answer";
    /// A TCP segment other than a plain SYN, of a class that judges
    /// state (`tcp_state`), to a port a listener of this host takes, that
    /// no socket of the host holds and that carries no valid SYN cookie:
    /// a flood's bare ACK, RST, FIN or data. Its charge was given back.
    TcpOutOfState = 28 => Drop, "tcp_out_of_state";
}

/// Number of counter slots in `STATS`.
pub const REASON_COUNT: usize = 29;

impl Reason {
    /// The action category of this reason (see [`Action`]).
    #[inline(always)]
    #[must_use]
    pub const fn action(self) -> Action {
        match (self, self.verdict()) {
            (Reason::ShadowDropped, _) => Action::ShadowDrop,
            (_, Verdict::Pass) => Action::Pass,
            // A SYN answered with a cookie is not delivered to the stack.
            (_, Verdict::Drop | Verdict::Tx) => Action::Drop,
        }
    }

    /// The reason stored at `index`, if any.
    #[must_use]
    pub const fn from_index(index: u32) -> Option<Reason> {
        if (index as usize) < REASON_COUNT { Some(Self::ALL[index as usize]) } else { None }
    }
}

/// Maximum stacked VLAN tags (802.1Q / 802.1ad) the parser walks.
pub const MAX_VLAN_DEPTH: usize = 2;
/// Maximum IPv6 extension headers the parser walks.
pub const MAX_IPV6_EXT_HEADERS: usize = 8;
/// Compare-and-swap attempts on one bucket before `Contended`.
pub const MAX_CAS_RETRIES: usize = 8;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discriminants_are_slot_indexes() {
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i, "{r:?}");
            assert_eq!(Reason::from_index(u32::try_from(i).unwrap()), Some(*r));
        }
        assert_eq!(Reason::from_index(u32::try_from(REASON_COUNT).unwrap()), None);
    }

    #[test]
    fn only_shadow_dropped_passes_as_a_would_be_drop() {
        for r in Reason::ALL {
            let expected = match r.verdict() {
                _ if r == Reason::ShadowDropped => Action::ShadowDrop,
                Verdict::Pass => Action::Pass,
                Verdict::Drop | Verdict::Tx => Action::Drop,
            };
            assert_eq!(r.action(), expected, "{r:?}");
        }
        assert_eq!(Reason::ShadowDropped.verdict(), Verdict::Pass);
    }

    #[test]
    fn labels_are_unique() {
        for a in Reason::ALL {
            for b in Reason::ALL {
                assert!(a == b || a.label() != b.label());
            }
        }
    }
}
