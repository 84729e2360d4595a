//! Why a change of the policy state was refused, in one type every part
//! of the state says it with (the engine's layers and each feature's,
//! `crate::groups::layer`), below them all.

use crate::{dataplane::LoadError, policy::error::PolicyError};

/// Why a change was refused: the policy (nothing changed), the kernel,
/// or the request itself.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("{0}")]
    Request(String),
    /// Entry `index` of a bulk load (0-based) is refused; nothing changed.
    #[error("entry {index}: {message}")]
    Entry { index: usize, message: String },
    /// The feedback governor refused a penalty.
    #[error("governor: {}: {message}", refusal.label())]
    Governor { refusal: crate::policy::feedback::Refusal, message: String },
}
