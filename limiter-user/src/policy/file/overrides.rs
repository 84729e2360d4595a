//! An `[[override]]` table as the file says it, and the override made of
//! it.

use serde::{Deserialize, Serialize};
use toml::Spanned;

use super::{Located, window::WindowSpec};
use crate::policy::{Action, Criticality, Limit, Mode, Override, OverrideAction, Scope, StoreFailure, bad};

#[derive(Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(super) struct OverrideSpec {
    pub(super) cidr: Spanned<String>,
    pub(super) action: Option<Action>,
    pub(super) rate: Option<u64>,
    pub(super) burst: Option<u64>,
    pub(super) mode: Option<Mode>,
    pub(super) limit: Option<u64>,
    #[serde(
        default,
        deserialize_with = "crate::policy::duration_opt",
        serialize_with = "crate::policy::duration_opt_out"
    )]
    pub(super) window: Option<std::time::Duration>,
    pub(super) slices: Option<u32>,
    pub(super) scope: Option<Scope>,
    pub(super) on_store_failure: Option<StoreFailure>,
    pub(super) criticality: Option<Criticality>,
}

pub(super) fn build_override(i: usize, o: Spanned<OverrideSpec>, default: Limit) -> Located<Override> {
    let start = o.span().start;
    let OverrideSpec { cidr, action, rate, burst, mode, limit, window, slices, scope, on_store_failure, criticality } =
        o.into_inner();
    let net = cidr
        .get_ref()
        .parse::<ipnet::IpNet>()
        .map_err(|e| (bad(format!("override[{i}].cidr"), format!("{:?}: {e}", cidr.get_ref())), cidr.span().start))?;
    let at = format!("override[{i}].");
    let window = WindowSpec { limit, window, slices, scope, on_store_failure }
        .build(&at, (rate, burst))
        .map_err(|e| (e, start))?;
    let mode = mode.unwrap_or(default.mode);
    let action = match (action, rate, burst, window) {
        (Some(word), None, None, None) => {
            let Some(a) = word.only(&[Action::Allow, Action::Deny]).ok().and_then(OverrideAction::of) else {
                let problem = format!(
                    "\"{word}\": an override's action is \"allow\" or \"deny\" (a limit is its rate and burst)"
                );
                return Err((bad(format!("override[{i}].action"), problem), start));
            };
            a
        }
        (None, Some(rate), Some(burst), None) => {
            OverrideAction::Limit(Limit { rate, burst, cost: default.cost, mode, window: None })
        }
        (None, None, None, Some(w)) => {
            OverrideAction::Limit(Limit { rate: 0, burst: 0, cost: default.cost, mode, window: Some(w) })
        }
        _ => {
            let problem = "give either action = \"allow\"/\"deny\", both rate and burst, or limit and window";
            return Err((bad(format!("override[{i}].action"), problem), start));
        }
    };
    Ok(Override { net, action, criticality })
}
