//! The guard against a reload that takes too much away at once.

use std::collections::HashSet;

use ipnet::IpNet;

use crate::policy::{Override, OverrideAction, Policy};

/// What `next` would take away at once from the running `current` file
/// policy, if it is too much for a reload to do unasked: more than half of
/// its overrides (two or more) lifted, or any token-bucket rate (the
/// default's or a class's, by name) cut more than 10x. `None`: nothing
/// of the kind.
#[must_use]
pub fn shrink(current: &Policy, next: &Policy) -> Option<String> {
    let mut why = Vec::new();
    let kept: HashSet<IpNet> = next.overrides.iter().map(|o| o.net).collect();
    let lifted: Vec<&Override> = current.overrides.iter().filter(|o| !kept.contains(&o.net)).collect();
    if lifted.len() >= 2 && lifted.len() * 2 > current.overrides.len() {
        let denies = lifted.iter().filter(|o| o.action == OverrideAction::Deny).count();
        why.push(format!(
            "it lifts {} of the {} overrides in force ({denies} of them denies)",
            lifted.len(),
            current.overrides.len()
        ));
    }
    let cut = |name: &str, was: &crate::policy::Limit, now: &crate::policy::Limit| {
        (was.window.is_none() && now.window.is_none() && now.rate.saturating_mul(10) < was.rate)
            .then(|| format!("it cuts the {name} rate from {} to {}", was.rate, now.rate))
    };
    why.extend(cut("default", &current.default, &next.default));
    for c in &current.classes {
        if let Some(n) = next.classes.iter().find(|n| n.name == c.name) {
            why.extend(cut(&format!("class {:?}", c.name), &c.limit, &n.limit));
        }
    }
    (!why.is_empty()).then(|| format!("the new policy is refused: {}", why.join("; ")))
}
