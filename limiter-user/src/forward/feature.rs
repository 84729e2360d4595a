//! The forwarders as a feature of the daemon.

use crate::engine::feature::{Drain, Feature, InForce};
use crate::{
    control::{ErrorCode, Request, Response, StatusInfo},
    series::Series,
};

impl Feature for super::Manager {
    /// Runs exactly the `[[forward]]` sections: unchanged ones keep
    /// running, changed and removed ones drain, new ones start.
    fn apply(&mut self, a: &InForce<'_>) {
        let ranks = std::sync::Arc::new(super::rank::Ranks::of(a.policy));
        self.update(&a.policy.forwards, super::Context { version: a.version, config: a.config, ranks });
    }

    /// Every forwarder's, in the policy's order.
    fn series(&self) -> Option<Box<dyn Series>> {
        Some(Box::new(super::Reports(self.reports())))
    }

    fn status(&self, status: &mut StatusInfo) {
        status.forwards = self.reports();
    }

    /// `limiter load`: a forwarder's adaptive limit.
    fn answer(&mut self, req: &Request) -> Option<Response> {
        let Request::Load { forward, rejected } = req else { return None };
        Some(match self.load(forward, *rejected) {
            Ok(a) => Response::Adaptive(a),
            Err(message) => Response::error(ErrorCode::Refused, message),
        })
    }

    fn drain(&mut self) -> Drain<'_> {
        Box::pin(self.drain_all())
    }
}
