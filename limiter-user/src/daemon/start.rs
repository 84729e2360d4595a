//! What a start does besides wiring: the first policy with what a
//! previous daemon set at run time put back, the feedback token checked
//! before anything is attached, and the pins of a start that failed to
//! attach taken away again.

use std::path::Path;

use super::{Enforcer, Settings};
use crate::{
    dataplane::DataPlane,
    policy::{Loaded, Policy},
};

/// The feedback endpoint's token, read and checked (its weaknesses
/// warned of), if the policy has `[feedback]`.
pub(super) fn feedback_token(policy: &Policy) -> anyhow::Result<Option<crate::feedback::Token>> {
    let Some(f) = &policy.feedback else { return Ok(None) };
    let (token, warnings) = crate::feedback::read_token(&f.token_file)?;
    for w in warnings {
        tracing::warn!(event = "feedback_token", "limiter: {w}");
    }
    Ok(Some(crate::feedback::Token::new(&token)))
}

/// Attaching failed after this start made the pins in `dir` (nothing
/// was adopted): without the attachment they protect nothing, so they go,
/// and a failed start leaves no maps (nor their memory) behind.
pub(super) fn unpin_failed_start(dp: DataPlane, dir: &Path) {
    drop(dp);
    if let Err(u) = crate::dataplane::pin::unload(dir, false) {
        tracing::warn!("limiter: removing the pins of this failed start from {}: {u}", dir.display());
    }
}

/// Apply the first policy: the file's (or the built-in one), with the
/// overrides a previous daemon set at run time put back over it (they are
/// part of the policy the pinned data plane enforces).
pub(super) fn first_apply(
    policy: &mut Enforcer,
    dp: &mut DataPlane,
    s: &Settings,
    loaded: Loaded,
    checked: crate::policy::Compiled,
) -> anyhow::Result<String> {
    let restored = policy.restore(dp)?;
    let unfit = policy.drop_unfit(&loaded.policy);
    for u in &unfit {
        tracing::warn!(
            "limiter: set aside the runtime override of {u}: the policy in force cannot hold it; it stays in the pinned record, and a restart with a policy that holds it puts it back"
        );
    }
    let restored = restored - unfit.len();
    if restored > 0
        && let Some(dir) = &s.pin_dir
    {
        tracing::info!(
            "limiter: {restored} runtime override(s) put back from {} (`limiter prefix list` shows them)",
            dir.join(limiter_common::maps::RUNTIME).display()
        );
    }
    match policy.apply_checked(dp, loaded, checked) {
        Ok(s) => Ok(s),
        Err(e) if restored > 0 => anyhow::bail!(
            "{e} (the policy with {restored} runtime override(s) put back from the pins; the pinned program keeps enforcing the last policy)"
        ),
        Err(e) => Err(e.into()),
    }
}
