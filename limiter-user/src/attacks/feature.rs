//! Attacks as the daemon's feature: told each second what the data plane
//! counted, each sampled drop, and every change that finished, it detects
//! attacks ([`Detector`]), logs a line when one starts, grows and ends,
//! keeps each record in the attacks file (at its start and its end;
//! `crate::records`), tells the webhooks, and answers `limiter attacks`.

use std::collections::VecDeque;

use prometheus_client::{
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
};

use super::{Detector, Event, webhook::Hooks};
use crate::control::{Attack, AttackAction, Attacks as Answer, Request, Response, StatusInfo};
use crate::dataplane::Totals;
use crate::engine::feature::{Applied, Feature, InForce, Note, Sample, Second, answered_change};
use crate::series::Series;

/// An attacks file is rotated past this size (the one before is kept as
/// `FILE.1`).
pub const MAX_FILE: u64 = 8 << 20;
/// Attacks kept in memory for `limiter attacks`.
pub const KEPT: usize = 500;
/// Passed frames a second drawn while an attack is built (what its
/// sources that were never refused got is estimated from them).
pub const PASSES_PER_SECOND: u64 = 1_000;

/// The attacks feature.
#[derive(Debug)]
pub(crate) struct AttacksFeature {
    detector: Detector,
    /// What the program had counted at the last tick.
    last: Option<Totals>,
    class_names: Vec<String>,
    host: String,
    file: Option<std::path::PathBuf>,
    writer: Option<crate::records::Writer>,
    kept: VecDeque<Attack>,
    hooks: Hooks,
    /// Attacks begun since the daemon started.
    begun: u64,
    /// The pcap of the attack being built.
    pcap: super::pcap::Recorder,
    /// The country and AS of the sources named so far, where the group
    /// files say them, for the attack being built.
    origins: std::collections::HashMap<ipnet::IpNet, (Option<String>, Option<u32>)>,
    /// The policy's bucket prefix lengths, IPv4 and IPv6 (a frame's
    /// bucket, as the program keys it).
    prefix_lens: (u32, u32),
}

impl AttacksFeature {
    /// The feature, keeping its records in `file` if given (read back
    /// first: ids go on from the last; one the daemon stopped during is
    /// marked so).
    pub(crate) fn start(file: Option<std::path::PathBuf>) -> Self {
        let read: VecDeque<Attack> =
            file.as_deref().map(|f| crate::records::read_back(f, KEPT * 2, MAX_FILE)).unwrap_or_default();
        // A record is written at the start and again at the end: the last
        // of each id stands.
        let mut kept: VecDeque<Attack> = VecDeque::new();
        for a in read {
            match kept.iter_mut().find(|k| k.id == a.id) {
                Some(k) => *k = a,
                None => kept.push_back(a),
            }
        }
        while kept.len() > KEPT {
            kept.pop_front();
        }
        for a in &mut kept {
            if a.ended.is_none() {
                a.ended = Some(a.started + a.duration_secs.saturating_sub(1));
                a.interrupted = true;
            }
        }
        let next = kept.iter().map(|a| a.id).max().unwrap_or(0) + 1;
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map_or_else(|_| "localhost".into(), |h| h.trim().to_owned());
        let writer = file.clone().map(|f| crate::records::Writer::start("attacks", f, MAX_FILE));
        let pcap = super::pcap::Recorder::new(file.as_deref());
        Self {
            detector: Detector::new(crate::policy::attacks::Attacks::default(), next),
            last: None,
            class_names: Vec::new(),
            host,
            file,
            writer,
            kept,
            hooks: Hooks::default(),
            begun: 0,
            pcap,
            origins: std::collections::HashMap::new(),
            prefix_lens: (24, 56),
        }
    }

    /// Keep `a` (replacing its earlier record) and write it.
    fn keep(&mut self, a: &Attack) {
        if let Some(w) = &mut self.writer {
            w.write(a);
        }
        if let Some(k) = self.kept.iter_mut().find(|k| k.id == a.id) {
            *k = a.clone();
        } else {
            if self.kept.len() == KEPT {
                self.kept.pop_front();
            }
            self.kept.push_back(a.clone());
        }
    }

    /// `a`'s sources with their country and AS where known.
    fn name_origins(&self, a: &mut Attack) {
        for s in &mut a.sources {
            if let Some((country, asn)) = s.name.parse().ok().and_then(|n: ipnet::IpNet| self.origins.get(&n)) {
                (s.country, s.asn) = (country.clone(), *asn);
            }
        }
    }

    fn event(&mut self, mut e: Event) {
        match &mut e {
            Event::Started(a) | Event::Grew(a) | Event::Ended(a) => self.name_origins(a),
        }
        match &mut e {
            Event::Started(a) => a.pcap = self.pcap.started(a.id, &self.class_names),
            Event::Grew(a) => a.pcap = self.pcap.pcap(),
            Event::Ended(a) => a.pcap = self.pcap.end(),
        }
        let (word, a) = match &e {
            Event::Started(a) => ("started", a),
            Event::Grew(a) => ("updated", a),
            Event::Ended(a) => ("ended", a),
        };
        let top: Vec<String> =
            a.sources.iter().take(3).map(|s| format!("{} {:.0}%", s.name, s.share * 100.0)).collect();
        let reasons: Vec<String> =
            a.reasons.iter().take(3).map(|r| format!("{} {:.0}%", r.name, r.share * 100.0)).collect();
        tracing::warn!(
            event = "attack",
            attack = a.id,
            state = word,
            "limiter: attack {} {word}: peak {} packets/s, {} bits/s refused; {} refused, {} passed in {} s; sources {}; reasons {}",
            a.id,
            a.peak_pps,
            a.peak_bps,
            a.refused.packets,
            a.passed.packets,
            a.duration_secs,
            if top.is_empty() { "not sampled yet".to_owned() } else { top.join(", ") },
            reasons.join(", ")
        );
        self.hooks.tell(word, &self.host, a);
        match e {
            Event::Started(a) => {
                self.begun += 1;
                self.keep(&a);
            }
            Event::Ended(a) => self.keep(&a),
            Event::Grew(_) => {}
        }
    }

    fn action(&mut self, by: &str, what: &str, ok: bool) {
        let (by, what) = (crate::one_line(by, 200), crate::one_line(what, 400));
        self.detector.action(AttackAction { at: crate::clock::unix_now(), by, what, ok });
    }
}

impl Feature for AttacksFeature {
    fn apply(&mut self, a: &InForce<'_>) {
        self.detector.set(a.policy.attacks.clone());
        self.class_names = a.class_names.to_vec();
        self.prefix_lens = (a.config.v4_prefix, a.config.v6_prefix);
        let attacks = &a.policy.attacks;
        self.hooks.follow(&attacks.webhooks, attacks.webhook_timeout, attacks.webhook_ca.as_deref());
    }

    fn tick(&mut self, s: &Second<'_>) {
        let last = self.last.replace(*s.totals);
        let Some(last) = last else { return };
        let delta = s.totals.since(&last);
        let e = self.detector.second(crate::clock::unix_now(), &delta, &self.class_names);
        if self.detector.building().is_some() {
            self.pcap.begin();
        }
        if let Some(e) = e {
            self.event(e);
        }
        // Nothing being built (a rise that did not last, or an attack
        // that just ended): its frames and names go.
        if self.detector.building().is_none() {
            self.pcap.abandon();
            self.origins.clear();
        }
        self.pcap.second(super::refused(&delta).packets);
    }

    fn frames(&mut self, frames: &[crate::capture::Frame], class_names: &[String]) {
        self.pcap.frames(frames, class_names);
        for f in frames {
            if let Some(src) = f.source() {
                let prefix = limiter_common::rules::bucket_key(&src, self.prefix_lens.0, self.prefix_lens.1, 0);
                self.detector.frame(&prefix, f.passed(), f.one_in);
            }
        }
    }

    fn wants_frames(&self) -> Option<crate::capture::Want> {
        self.pcap.want()
    }

    fn wants_passes(&self) -> Option<u64> {
        self.detector.wants_passes().then_some(PASSES_PER_SECOND)
    }

    fn wants_described(&mut self) -> Vec<ipnet::IpNet> {
        self.detector.top_sources().into_iter().filter(|n| !self.origins.contains_key(n)).collect()
    }

    fn described(&mut self, net: ipnet::IpNet, show: &crate::control::PrefixShow) {
        // What no file says yet is asked again at the next tick (a group
        // file read after the attack began).
        let g = show.group.as_ref();
        let (country, asn) = (g.and_then(|g| g.country.clone()), g.and_then(|g| g.asn));
        if country.is_some() || asn.is_some() {
            self.origins.insert(net, (country, asn));
        }
    }

    fn sampled(&mut self, s: &Sample) {
        self.detector.sampled(&s.key, s.reason, s.port);
    }

    fn applied(&mut self, a: &mut Applied<'_>) {
        let (who, what) = a.change.describe(None);
        let by = a.by.map_or(who, ToString::to_string);
        let what = if a.ok { what } else { format!("{what} (refused: {})", a.line) };
        self.action(&by, &what, a.ok);
    }

    fn answered(&mut self, req: &Request, by: &crate::control::server::Requester, answer: &Response) {
        if let Some((what, ok, _)) = answered_change(req, answer) {
            self.action(&by.to_string(), &what, ok);
        }
    }

    fn noted(&mut self, n: &Note) {
        self.action(&n.by, &n.what, true);
    }

    fn answer(&mut self, req: &Request) -> Option<Response> {
        let Request::Attacks { id, limit } = req else { return None };
        let active = self.detector.active(&self.class_names).map(|mut a| {
            a.pcap = self.pcap.pcap();
            self.name_origins(&mut a);
            a
        });
        let all = self.kept.iter().filter(|k| active.as_ref().is_none_or(|a| a.id != k.id)).chain(active.as_ref());
        let mut attacks: Vec<Attack> = match id {
            Some(id) => all.filter(|a| a.id == *id).cloned().collect(),
            None => all.cloned().collect(),
        };
        let skip = attacks.len().saturating_sub(*limit);
        attacks.drain(..skip);
        Some(Response::Attacks(Answer { attacks, file: self.file.as_ref().map(|f| f.display().to_string()) }))
    }

    fn status(&self, status: &mut StatusInfo) {
        use std::sync::atomic::Ordering::Relaxed;
        let now = match self.detector.active(&self.class_names) {
            Some(a) => format!(
                "ATTACK {} for {} ({} packets/s refused at peak)",
                a.id,
                crate::clock::human::duration(a.duration_secs),
                a.peak_pps
            ),
            None => format!("none now ({} begun since start)", self.begun),
        };
        let hooks: Vec<String> = self
            .hooks
            .iter()
            .map(|h| {
                let f = &h.fares;
                let last = f.last_error.lock().ok().and_then(|e| e.clone());
                let failing = last.map_or_else(String::new, |e| format!(", FAILING: {e}"));
                format!(
                    "webhook {}: {} delivered, {} failed, {} dropped{failing}",
                    h.url,
                    f.delivered.load(Relaxed),
                    f.failed.load(Relaxed),
                    f.dropped.load(Relaxed)
                )
            })
            .collect();
        status.attacks = Some(std::iter::once(now).chain(hooks).collect::<Vec<_>>().join("; "));
    }

    fn series(&self) -> Option<Box<dyn Series>> {
        use std::sync::atomic::Ordering::Relaxed;
        let hooks = self
            .hooks
            .iter()
            .map(|h| (h.url.clone(), [&h.fares.delivered, &h.fares.failed, &h.fares.dropped].map(|c| c.load(Relaxed))))
            .collect();
        let classes = self
            .detector
            .active(&self.class_names)
            .map(|a| a.classes.into_iter().map(|c| (c.name, c.share)).collect())
            .unwrap_or_default();
        Some(Box::new(Report { active: self.detector.is_active(), begun: self.begun, classes, hooks }))
    }
}

/// The feature's series.
#[derive(Debug)]
struct Report {
    active: bool,
    begun: u64,
    /// The attack going on's classes and their share of its sampled
    /// refused packets.
    classes: Vec<(String, f64)>,
    /// Each webhook: delivered, failed, dropped.
    hooks: Vec<(String, [u64; 3])>,
}

impl Series for Report {
    fn encode(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let m = enc.encode_descriptor(
            "limiter_attack_active",
            "1 while an attack goes on ([attacks]: refused above drops_per_sec or bits_per_sec for sustain, until quiet).",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(i64::from(self.active)).encode(m)?;
        let mut m = enc.encode_descriptor(
            "limiter_attack_class_share",
            "While an attack goes on, each class it refuses packets of and its share of them (0 to 1, from the sampled drops).",
            None,
            MetricType::Gauge,
        )?;
        for (class, share) in &self.classes {
            ConstGauge::new(*share).encode(m.encode_family(&[("class", class.as_str())])?)?;
        }
        let m = enc.encode_descriptor(
            "limiter_attacks",
            "Attacks begun since the daemon started.",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(self.begun).encode(m)?;
        let mut m = enc.encode_descriptor(
            "limiter_attack_webhooks",
            "Attack events per webhook by result: delivered, failed (every try), dropped (its queue was full).",
            None,
            MetricType::Counter,
        )?;
        for (url, counts) in &self.hooks {
            for (result, n) in ["delivered", "failed", "dropped"].into_iter().zip(counts) {
                ConstCounter::new(*n).encode(m.encode_family(&[("webhook", url.as_str()), ("result", result)])?)?;
            }
        }
        Ok(())
    }
}
