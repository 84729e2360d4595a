//! The out-of-state check as a feature of the daemon: the `auto` classes
//! engaged, followed each second from the program's trigger.

use crate::{
    control::StatusInfo,
    engine::feature::{Feature, InForce, Note, Second},
    policy::TcpState,
};

#[derive(Debug, Default)]
pub(crate) struct TcpStateFeature {
    /// The classes judged at the last tick (`always`, or `auto` engaged).
    judging: Vec<String>,
    /// The `auto` classes engaged at the last tick.
    engaged: Vec<String>,
    /// Engagements and releases since the last ask.
    notes: Vec<Note>,
}

impl Feature for TcpStateFeature {
    fn apply(&mut self, _: &InForce<'_>) {}

    fn tick(&mut self, second: &Second<'_>) {
        let auto = |c: &&crate::control::TcpStateRow| c.mode == TcpState::Auto && c.engaged;
        let now: Vec<String> = second.tcp_state.iter().filter(auto).map(|c| c.class.clone()).collect();
        let by = "tcp state (auto)".to_owned();
        for class in now.iter().filter(|c| !self.engaged.contains(c)) {
            tracing::info!(
                event = "tcp_state_engaged",
                class = %class,
                "limiter: out-of-state TCP check engaged for class {class} (segments no connection holds)"
            );
            self.notes.push(Note { by: by.clone(), what: format!("engaged for class {class} (out-of-state TCP)") });
        }
        for class in self.engaged.iter().filter(|c| !now.contains(c)) {
            tracing::info!(event = "tcp_state_released", class = %class, "limiter: out-of-state TCP check released for class {class}");
            self.notes.push(Note { by: by.clone(), what: format!("released for class {class}") });
        }
        self.engaged = now;
        self.judging = second.tcp_state.iter().filter(|c| c.engaged).map(|c| c.class.clone()).collect();
    }

    fn notes(&mut self) -> Vec<Note> {
        std::mem::take(&mut self.notes)
    }

    fn status(&self, status: &mut StatusInfo) {
        status.tcp_state_judging.clone_from(&self.judging);
    }
}
