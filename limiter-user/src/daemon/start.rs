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

/// The feedback endpoint, if the policy has `[feedback]` (and so a token).
pub(super) async fn serve_feedback(
    policy: &Policy,
    token: Option<crate::feedback::Token>,
    calls: &tokio::sync::mpsc::Sender<crate::control::server::Call>,
) -> anyhow::Result<Option<crate::feedback::Endpoint>> {
    let (Some(f), Some(token)) = (&policy.feedback, token) else { return Ok(None) };
    let bound = crate::feedback::serve(f.listen, token.clone(), calls.clone()).await?;
    tracing::info!(
        "limiter: feedback on http://{bound}/v1/penalties (governor: at most {} denied, /{} or /{} at widest, TTL at most {} s{})",
        f.max_denied,
        f.min_v4_prefix,
        f.min_v6_prefix,
        f.max_ttl.as_secs(),
        if f.shadow { ", shadow" } else { "" }
    );
    Ok(Some(crate::feedback::Endpoint { bound, token_file: f.token_file.clone(), token }))
}

/// `/metrics`, if asked: an aid, so a busy port is said and the interface
/// stays protected.
pub(super) async fn serve_metrics(
    addr: Option<std::net::SocketAddr>,
    scrapes: tokio::sync::mpsc::Sender<crate::metrics::ScrapeCall>,
) {
    let Some(addr) = addr else { return };
    match crate::metrics::serve(addr, scrapes).await {
        Ok(bound) => tracing::info!("limiter: metrics on http://{bound}/metrics"),
        Err(e) => tracing::warn!("limiter: metrics not served on {addr}: {e}"),
    }
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
