//! The daemon's side of fleet-wide quotas: start the sync when the policy
//! has a `[fleet]` section, tell it the classes of each policy applied,
//! and answer `fleet status` and `prefix show`. Without `[fleet]` the
//! daemon still keeps the wall-clock offset current, so window slices
//! start on whole multiples of their length.

use ipnet::IpNet;
use limiter_common::{
    BucketKey, Config, MAX_CLASSES, packet, rules,
    window::{self, FleetSlot, WindowState, scope},
};

use super::{ClassWindow, Classes, FleetStatus, FleetSync, Readers, wall_and_offset};
use crate::engine::feature::{Feature, InForce, Second};
use crate::{
    control::{PrefixShow, Request, Response, WindowRow},
    dataplane::maps::WindowMaps,
    policy::fleet::Fleet,
    policy::{OverrideAction, Policy, Scope},
    series::Series,
};

/// The fleet sync, or the maps it would have taken.
pub(crate) enum FleetSide {
    Off(Option<Box<WindowMaps>>),
    /// The sync, its read handles, and the `[fleet]` it started with.
    On(Box<(FleetSync, Readers, Fleet)>),
    /// `[fleet]` was removed: the sync is winding down (the maps come back
    /// when it has); a `[fleet]` applied meanwhile starts then.
    Stopping(Box<(FleetSync, Readers, Next)>),
}

/// The sync to start once a stopping one has handed its maps back.
type Next = Option<(Fleet, Classes)>;

/// The window quotas of `config` (classes, named) and `policy` (its
/// window overrides).
pub(crate) fn classes(config: &Config, names: &[String], policy: &Policy) -> Classes {
    let by_index = (0..MAX_CLASSES)
        .map(|i| {
            let l = config.classes[i];
            l.is_window().then(|| ClassWindow {
                name: names.get(i).cloned().unwrap_or_else(|| format!("class{i}")),
                limit: l.window_limit(),
                slice_ns: l.slice_ns(),
                slices: l.slices,
                fleet: l.scope & scope::FLEET != 0,
            })
        })
        .collect();
    let mut overrides: Vec<(IpNet, ClassWindow)> = policy
        .overrides
        .iter()
        .filter_map(|o| {
            let OverrideAction::Limit(l) = o.action else { return None };
            let w = l.window?;
            let ns = u64::try_from(w.length.as_nanos()).unwrap_or(u64::MAX);
            Some((
                o.net,
                ClassWindow {
                    name: format!("override:{}", o.net),
                    limit: w.limit,
                    slice_ns: ns / u64::from(w.slices.max(1)),
                    slices: w.slices,
                    fleet: w.scope == Scope::Fleet,
                },
            ))
        })
        .collect();
    overrides.sort_by_key(|(n, _)| std::cmp::Reverse(n.prefix_len()));
    Classes { by_index, overrides }
}

impl FleetSide {
    /// Start the sync for `fleet` (or keep the maps when there is none).
    pub(crate) fn start(
        fleet: Option<&Fleet>,
        maps: Option<Box<WindowMaps>>,
        classes: Classes,
    ) -> anyhow::Result<Self> {
        match (fleet, maps) {
            (Some(cfg), Some(maps)) => {
                let readers = Readers::of(&maps)?;
                tracing::info!(
                    "limiter: fleet sync as {:?} every {} ms with {} ({})",
                    cfg.node,
                    cfg.sync_interval.as_millis(),
                    cfg.store.join(", "),
                    if cfg.is_cluster() { "Redis Cluster" } else { "Redis" }
                );
                Ok(Self::On(Box::new((FleetSync::spawn(cfg.clone(), maps, classes)?, readers, cfg.clone()))))
            }
            (_, maps) => {
                let mut side = Self::Off(maps);
                side.upkeep();
                Ok(side)
            }
        }
    }

    /// The policy changed: its classes apply at once, and so does a
    /// changed, new or removed `[fleet]` section (the sync takes the new
    /// store, node name and interval from its next round, starts, or
    /// stops and forgets the other nodes' counts).
    pub(crate) fn set_classes(&mut self, classes: Classes, fleet: Option<&Fleet>) {
        if fleet.is_none() && matches!(self, Self::On(_)) {
            let Self::On(on) = std::mem::replace(self, Self::Off(None)) else { unreachable!("matched above") };
            let (sync, readers, cfg) = *on;
            tracing::info!(
                "limiter: the policy has no [fleet] section any more; stopping the fleet sync with {} as {:?}",
                cfg.store.join(", "),
                cfg.node
            );
            sync.stop();
            *self = Self::Stopping(Box::new((sync, readers, None)));
            return;
        }
        match self {
            Self::On(on) => {
                on.0.set_classes(classes);
                match fleet {
                    Some(cfg) if *cfg != on.2 => {
                        tracing::info!(
                            "limiter: fleet sync now as {:?} every {} ms with {}",
                            cfg.node,
                            cfg.sync_interval.as_millis(),
                            cfg.store.join(", ")
                        );
                        on.0.set_config(cfg.clone());
                        on.2 = cfg.clone();
                    }
                    _ => {}
                }
            }
            Self::Stopping(s) => s.2 = fleet.map(|f| (f.clone(), classes)),
            Self::Off(maps @ Some(_)) if fleet.is_some() => match Self::start(fleet, maps.take(), classes) {
                Ok(side) => *self = side,
                Err(e) => tracing::warn!(
                    "limiter: the fleet sync could not start ({e:#}); fleet-scope quotas count this host only until the daemon restarts"
                ),
            },
            Self::Off(_) => {}
        }
    }

    #[must_use]
    pub(crate) fn status(&self) -> Option<FleetStatus> {
        match self {
            Self::On(on) => Some(on.0.status()),
            Self::Off(_) | Self::Stopping(_) => None,
        }
    }
}

impl FleetSide {
    /// The `WINDOWS` and `FLEET` maps, to read.
    fn maps(&self) -> Option<(&WindowMap, &WindowMap)> {
        match self {
            Self::On(on) => Some((&on.1.windows, &on.1.fleet)),
            Self::Stopping(s) => Some((&s.1.windows, &s.1.fleet)),
            Self::Off(Some(m)) => Some((&m.windows, &m.fleet)),
            Self::Off(None) => None,
        }
    }

    /// Take the maps back from a sync that has stopped (and start the one
    /// a later policy asked for); without a sync, keep the wall-clock
    /// offset current.
    fn upkeep(&mut self) {
        if let Self::Stopping(s) = self
            && let Some(maps) = s.0.stopped()
        {
            let next = s.2.take();
            if maps.is_none() {
                tracing::warn!(
                    "limiter: the fleet sync's thread died; window quotas run without their maps' upkeep until the daemon restarts"
                );
            }
            *self = Self::Off(maps);
            if let Some((cfg, classes)) = next {
                self.set_classes(classes, Some(&cfg));
            }
        }
        if let Self::Off(Some(m)) = self {
            let _ = m.state.set(FleetSlot::WallOffset.index(), wall_and_offset().1, 0);
        }
    }
}

impl Feature for FleetSide {
    /// The window-quota classes apply at once; a changed, new or removed
    /// `[fleet]` section changes, starts or stops the sync.
    fn apply(&mut self, a: &InForce<'_>) {
        self.set_classes(classes(&a.config, a.class_names, a.policy), a.policy.fleet.as_ref());
    }

    /// Only while the sync runs.
    fn series(&self) -> Option<Box<dyn Series>> {
        self.status().map(|s| Box::new(s) as Box<dyn Series>)
    }

    /// The window quotas of the bucket prefix of `src`: each class's (and
    /// window override's) count here and across the fleet.
    fn show(&self, src: &packet::Source, a: &InForce<'_>, out: &mut PrefixShow) {
        let config = &a.config;
        let maps = self.maps();
        let wall = wall_and_offset().0;
        let windows = classes(config, a.class_names, a.policy);
        for i in 0..MAX_CLASSES {
            let key = rules::bucket_key(src, config.v4_prefix, config.v6_prefix, u8::try_from(i).unwrap_or(0));
            let Some(c) = windows.of(&key) else { continue };
            let (cur, _, edge) = window::locate(wall, c.slice_ns);
            let count = |m: &WindowMap| m.get(&key, 0).map_or(0, |w| window::total(&w, cur, edge, c.slices));
            let (local, fleet) = maps.map_or((0, 0), |(w, f)| (count(w), if c.fleet { count(f) } else { 0 }));
            #[expect(clippy::cast_precision_loss, reason = "display")]
            let window_secs = (c.slice_ns * u64::from(c.slices)) as f64 / 1e9;
            out.windows.push(WindowRow {
                class: c.name.clone(),
                scope: if c.fleet { Scope::Fleet } else { Scope::Local },
                limit: c.limit,
                window_secs,
                slices: c.slices,
                local,
                fleet,
                remaining: c.limit.saturating_sub(local + fleet),
            });
        }
    }

    /// `limiter fleet status`.
    fn answer(&mut self, req: &Request) -> Option<Response> {
        matches!(req, Request::FleetStatus).then(|| Response::Fleet { status: self.status() })
    }

    /// Once a second: see [`FleetSide::upkeep`].
    fn tick(&mut self, _: &Second<'_>) {
        self.upkeep();
    }
}

/// A read handle on a map of slice counts.
type WindowMap = aya::maps::HashMap<aya::maps::MapData, BucketKey, WindowState>;
