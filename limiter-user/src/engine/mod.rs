//! What the daemon's loop and its features share, naming no feature: the
//! policy state (`enforcer`: the file's policy, the runtime layers over
//! it, the data plane's version, each change all or nothing), a change
//! and the queue that runs them off the loop (`changes`), the one path
//! of decisions every decider sends down (`decision`: the `Sink`), a
//! source of decisions' change (`source`), the face every feature shows
//! the loop (`feature`: its hooks), and how the daemon is to run
//! (`settings`). Features live in rooms below this one; the loop, below
//! them, names none but in its one registration list.

pub mod changes;
pub mod decision;
pub mod enforcer;
pub mod error;
pub mod feature;
pub mod settings;
pub mod source;

pub use self::{
    enforcer::{ApplyError, Enforcer},
    settings::Settings,
};
