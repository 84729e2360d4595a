//! The steps of a start, in order: everything checked before the kernel
//! is touched ([`Checked`]); the data plane opened or re-adopted with the
//! first policy written ([`load`]: what a previous daemon set at run time
//! put back); attached ([`attach`]: a failed start takes its new pins
//! away again); then the listeners. [`Daemon::start`](super::Daemon)
//! wires them.

use std::path::Path;

use super::os::resolve_group;
use crate::engine::{Enforcer, Settings};
use crate::{
    control::server::Access,
    dataplane::{Attachment, DataPlane, LoadError, PolicyMaps as _, upgrade::Renewal},
    policy::{Compiled, Loaded as Read, Policy},
};

/// What a start checks before it touches the kernel.
pub(super) struct Checked {
    loaded: Read,
    /// Its compilation, which the first apply reuses.
    compiled: Compiled,
    token: Option<crate::feedback::Token>,
    pub(super) access: Access,
}

impl Checked {
    /// The policy read and validated, the feedback token read, the
    /// socket's group and the interface found.
    pub(super) fn of(settings: &Settings) -> anyhow::Result<Self> {
        let loaded = settings.load_policy()?;
        let compiled = loaded.check()?;
        let token = feedback_token(&loaded.policy)?;
        let access = Access { gid: settings.socket_group.as_deref().map(resolve_group).transpose()? };
        // An interface that exists: no pins left behind for a typo.
        crate::dataplane::ifindex(&settings.iface)?;
        Ok(Self { loaded, compiled, token, access })
    }
}

/// A data plane with the first policy written, not attached yet.
pub(super) struct Loaded {
    pub(super) dp: DataPlane,
    /// `Some`: pinned maps re-adopted (those renewed listed).
    pub(super) adopted: Option<Vec<Renewal>>,
    pub(super) enforcer: Enforcer,
    /// The first policy's summary.
    pub(super) summary: String,
    pub(super) token: Option<crate::feedback::Token>,
}

/// Open the data plane (or re-adopt the pinned one) and write the first
/// policy into it.
/// `without_cookies`: load the program built without SYN cookies, for
/// why (a dispatcher that refused the full one's component).
pub(super) fn load(settings: &Settings, checked: Checked, without_cookies: Option<String>) -> anyhow::Result<Loaded> {
    let Checked { loaded, compiled, token, .. } = checked;
    // A kernel without a helper the program calls is named in one line
    // before anything is loaded or pinned (the verifier's own refusal
    // would name the helper by number); without the SYN cookie helpers
    // only, the program without cookies runs if the policy may run so.
    let mut plan = crate::dataplane::kernel::plan().map_err(anyhow::Error::msg)?;
    plan.priority = settings.priority;
    if let Some(why) = without_cookies {
        plan.program = crate::dataplane::kernel::Program::WithoutSynCookies;
        plan.lacks = Some(why);
    }
    if let Some(lacks) = &plan.lacks {
        crate::engine::enforcer::kernel::cookies_without_kernel(&loaded.policy, lacks)
            .map_err(|e| loaded.provenance.locate(e, &loaded.policy))?;
        tracing::warn!(event = "kernel_lacks", "limiter: {lacks}: loading the program without SYN cookies");
    }
    let capacity = loaded.policy.capacity;
    let (mut dp, adopted) = match &settings.pin_dir {
        Some(dir) => DataPlane::open_pinned(capacity, dir, plan.clone())?,
        None => (DataPlane::open_program(capacity, plan.clone())?, None),
    };
    // Versions continue from what a re-adopted data plane enforces (or a
    // renewed CONFIG held).
    let version = dp.active_config()?.map_or(0, |c| c.version).max(dp.carried_version());
    let mut enforcer = Enforcer::new(version, dp.capacity());
    enforcer.kernel_lacks_cookies = plan.lacks;
    let summary = first_apply(&mut enforcer, &mut dp, settings, loaded, compiled)?;
    Ok(Loaded { dp, adopted, enforcer, summary, token })
}

/// Attach (through the pinned link when pinning): the attachment, and
/// whether it replaced a program on the pinned link. A pinned start that
/// adopted nothing and fails to attach takes its pins away again.
pub(super) fn attach(dp: &mut DataPlane, s: &Settings, adopted: bool) -> Result<(Attachment, bool), LoadError> {
    if DataPlane::chained(&s.iface, s.attach)? {
        return dp.attach_chained(&s.iface, s.mode, s.pin_dir.as_deref(), s.priority).inspect_err(|_| {
            if let (false, Some(dir)) = (adopted, &s.pin_dir) {
                unpin_failed_start(dir);
            }
        });
    }
    let Some(dir) = &s.pin_dir else { return Ok((dp.attach(&s.iface, s.mode)?, false)) };
    dp.attach_pinned(&s.iface, s.mode, dir).inspect_err(|_| {
        if !adopted {
            unpin_failed_start(dir);
        }
    })
}

/// The feedback endpoint's token, read and checked (its weaknesses
/// warned of), if the policy has `[feedback]`.
fn feedback_token(policy: &Policy) -> anyhow::Result<Option<crate::feedback::Token>> {
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
/// and a failed start leaves no maps (nor their memory) behind once its
/// data plane is dropped.
fn unpin_failed_start(dir: &Path) {
    if let Err(u) = crate::dataplane::pin::unload(dir, false) {
        tracing::warn!("limiter: removing the pins of this failed start from {}: {u}", dir.display());
    }
}

/// Apply the first policy: the file's (or the built-in one), with the
/// overrides a previous daemon set at run time put back over it (they are
/// part of the policy the pinned data plane enforces).
fn first_apply(
    policy: &mut Enforcer,
    dp: &mut DataPlane,
    s: &Settings,
    loaded: Read,
    checked: Compiled,
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
    crate::sources::feature::read_first(policy, &loaded.policy);
    match policy.apply_checked(dp, loaded, checked) {
        Ok(s) => Ok(s),
        Err(e) if restored > 0 => anyhow::bail!(
            "{e} (the policy with {restored} runtime override(s) put back from the pins; the pinned program keeps enforcing the last policy)"
        ),
        Err(e) => Err(e.into()),
    }
}
