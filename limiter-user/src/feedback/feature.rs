//! The feedback endpoint as a feature of the daemon: its penalties reach
//! the policy state as requests (`Change::Penalty`, under the governor);
//! here, its token read again on SIGHUP, and its address and token file
//! in force shown where the file says otherwise.

use std::fmt::Write as _;

use super::Endpoint;
use crate::engine::feature::{Feature, InForce};
use crate::policy::Policy;

impl Feature for Endpoint {
    /// Where it listens and its token file take a restart (the token
    /// itself is read again on SIGHUP): nothing to change here.
    fn apply(&mut self, _: &InForce<'_>) {}

    /// Read the token again (a rotated file is taken at once; a bad one
    /// is refused and the old token stays), and say plainly when the
    /// policy's `listen` or `token_file` moved, which takes a restart.
    fn reload(&mut self, a: &InForce<'_>) {
        let Endpoint { bound, token_file: file, token } = self;
        if let Some(f) = &a.policy.feedback
            && ((f.listen.port() != 0 && f.listen != *bound) || f.token_file != *file)
        {
            tracing::warn!(
                event = "feedback_token",
                "limiter: SIGHUP: feedback.listen {} and token_file {} take effect at the next restart; the endpoint stays on http://{bound} with {}",
                f.listen,
                f.token_file.display(),
                file.display()
            );
        }
        match super::read_token(file) {
            Ok((t, warnings)) => {
                for w in warnings {
                    tracing::warn!(event = "feedback_token", "limiter: {w}");
                }
                token.replace(&t);
                tracing::info!(
                    event = "feedback_token",
                    "limiter: SIGHUP: feedback token read again from {}",
                    file.display()
                );
            }
            Err(e) => {
                tracing::warn!(event = "feedback_token", "limiter: SIGHUP: {e}; the token in force stays");
            }
        }
    }

    /// `policy show`: the address and token file it started with (they
    /// take a restart), said where the file says otherwise.
    fn in_force(&self, p: &mut Policy, note: &mut String) {
        if let Some(f) = p.feedback.as_mut()
            && ((f.listen.port() != 0 && f.listen != self.bound) || f.token_file != self.token_file)
        {
            let _ = writeln!(
                note,
                "# [feedback] in the file: listen = \"{}\", token_file = {:?}; in force until a restart: the values below",
                f.listen,
                f.token_file.display().to_string()
            );
            (f.listen, f.token_file) = (self.bound, self.token_file.clone());
        }
    }
}
