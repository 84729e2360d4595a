//! `missing_kernel_feature`: what a daemon does when the running kernel
//! lacks what a feature the policy asks for needs (today: the raw SYN
//! cookie helpers, kernel 6.0+ built with `CONFIG_SYN_COOKIES`). See
//! docs/operations.md#kernels.

use serde::{Deserialize, Serialize};

/// Refuse the policy (the default: never a silent loss of protection),
/// or run it with the feature off, said at start, in the policy's
/// summary, in `limiter status` and in `limiter_syn_cookies_available`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MissingFeature {
    #[default]
    Refuse,
    RunWithout,
}

impl MissingFeature {
    /// Whether this is the default (left out of a rendered file).
    #[must_use]
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}
