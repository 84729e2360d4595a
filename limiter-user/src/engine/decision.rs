//! The one path of decisions: whoever decides (the operator on the
//! control socket, the tenant layer's penalties, SIGHUP's re-read of the
//! policy file, the feeds, CrowdSec, the country and ASN groups) sends a
//! [`Decision`] down one [`Sink`], and the daemon's loop takes them all in
//! one arm, in order, to the policy state (see `changes.rs`). The daemon's
//! own escalation, a feature that hears the program's sampled drops,
//! sends its penalties down the same sink once a second.
//!
//! The operator's and the tenant's requests arrive on the control channel
//! with queries mixed in; [`route`] sends each change request down the
//! path with its client's reply, and only the queries to the loop's
//! answers.

use tokio::{signal::unix::Signal, sync::mpsc};

use super::{changes::Change, source::SourceChange};
use crate::control::server::{Call, Reply};

/// Where every decider sends its decisions.
pub(crate) type Sink = mpsc::Sender<Decision>;

/// Decisions sent and not yet taken by the loop, all deciders together
/// (each source bounds its own: a feed one version, CrowdSec two pulls;
/// the control socket its clients, each waiting for its answer).
pub(crate) const SINK_ROOM: usize = 64;

/// A decision on its way to the policy state.
#[derive(Debug)]
pub(crate) enum Decision {
    /// A change somebody waits on (the operator's `prefix set`, `policy
    /// apply`, a tenant's penalty): answered when it is done.
    Asked(Change, Reply),
    /// A change nobody waits on (SIGHUP's re-read, an escalation).
    Told(Change),
    /// A source's change (a feed's version, a CrowdSec pull): applied
    /// after what the operator asked, whole or in parts.
    Source(Box<dyn SourceChange>),
}

/// Send each change request of `calls` (the control socket's, the
/// feedback endpoint's) down `sink` with its reply, and the rest to
/// `queries`. Ends when every sender of `calls` is gone or the loop is.
pub(crate) async fn route(mut calls: mpsc::Receiver<Call>, sink: Sink, queries: mpsc::Sender<Call>) {
    while let Some((mut req, reply)) = calls.recv().await {
        let sent = match Change::of(&mut req) {
            Some(change) => sink.send(Decision::Asked(change, reply)).await.is_ok(),
            None => queries.send((req, reply)).await.is_ok(),
        };
        if !sent {
            return;
        }
    }
}

/// The policy file's decider: every SIGHUP asks to read it again. The
/// signal is caught from the daemon's start, so one during start-up waits
/// here instead of killing the process.
pub(crate) async fn hangups(mut hup: Signal, sink: Sink) {
    while hup.recv().await.is_some() {
        if sink.send(Decision::Told(Change::Reload)).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::Request;

    /// A change request goes down the path with its reply, a query to the
    /// answers, in the order sent; nothing else is made up on the way.
    #[tokio::test]
    async fn change_requests_take_the_path_and_queries_the_answers() {
        let (calls_tx, calls) = mpsc::channel(4);
        let (sink, mut decided) = mpsc::channel(4);
        let (queries_tx, mut queries) = mpsc::channel(4);
        let task = tokio::spawn(route(calls, sink, queries_tx));
        let operator = crate::control::server::Requester::Client { uid: 0, pid: Some(1) };
        let (set_reply, mut set_answer) = Reply::new(operator.clone());
        let cidr = "198.18.0.0/24".parse().unwrap();
        calls_tx
            .send((Request::PrefixDeny { cidr, ttl_secs: Some(5), upstream: false, reason: None }, set_reply))
            .await
            .unwrap();
        let (status_reply, _) = Reply::new(operator);
        calls_tx.send((Request::Status, status_reply)).await.unwrap();
        drop(calls_tx);
        task.await.unwrap();
        let Some(Decision::Asked(Change::Prefix { cidr: got, ttl: Some(5), .. }, reply)) = decided.recv().await else {
            panic!("the deny request did not take the path of decisions");
        };
        assert_eq!(got, cidr);
        assert_eq!(reply.by.to_string(), "uid 0 pid 1", "who asked went along");
        assert!(reply.send(crate::control::Response::error(crate::control::ErrorCode::Busy, "marker")));
        assert!(
            matches!(set_answer.try_recv(), Ok(crate::control::Response::Error { message, .. }) if message == "marker"),
            "the client's reply went along"
        );
        assert!(decided.recv().await.is_none(), "one decision for one change request");
        assert!(matches!(queries.recv().await, Some((Request::Status, _))));
        assert!(queries.recv().await.is_none());
    }
}
