//! The tunnels' maps, taken out of the loaded object with the others and
//! handed to the tunnels' feature, which alone writes and reads them.

use aya::{
    Ebpf,
    maps::{Array, HashMap, MapData, PerCpuArray},
};
use limiter_common::{
    Counter, maps,
    tunnel::{Backend, Hop, OUTCOMES, Service, ServiceKey, TABLE_SIZE},
};

use crate::dataplane::{LoadError, maps::Named as _};

/// `TUNNEL_SERVICES`, `TUNNEL_TABLE`, `TUNNEL_BACKENDS`, `TUNNEL_HITS`,
/// `TUNNEL_OUTCOMES` (the connection table is the program's own).
pub struct TunnelMaps {
    pub(crate) services: HashMap<MapData, ServiceKey, Service>,
    pub(crate) table: Array<MapData, u32>,
    pub(crate) backends: Array<MapData, Backend>,
    pub(crate) hits: PerCpuArray<MapData, Counter>,
    pub(crate) hops: PerCpuArray<MapData, Hop>,
    pub(crate) outcomes: PerCpuArray<MapData, u64>,
}

/// What a daemon before this one left in the pinned maps: each backend
/// index written, and each service key with its table's index.
#[derive(Debug, Default)]
pub(crate) struct Left {
    pub(crate) backends: Vec<(u32, Backend)>,
    pub(crate) services: Vec<(ServiceKey, u32)>,
}

impl std::fmt::Debug for TunnelMaps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TunnelMaps")
    }
}

impl TunnelMaps {
    pub(crate) fn take(ebpf: &mut Ebpf) -> Result<Self, LoadError> {
        fn take<T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>>(
            ebpf: &mut Ebpf,
            name: &'static str,
        ) -> Result<T, LoadError> {
            T::try_from(ebpf.take_map(name).ok_or(LoadError::MissingMap(name))?).on(name)
        }
        Ok(Self {
            services: take(ebpf, maps::TUNNEL_SERVICES)?,
            table: take(ebpf, maps::TUNNEL_TABLE)?,
            backends: take(ebpf, maps::TUNNEL_BACKENDS)?,
            hits: take(ebpf, maps::TUNNEL_HITS)?,
            hops: take(ebpf, maps::TUNNEL_HOPS)?,
            outcomes: take(ebpf, maps::TUNNEL_OUTCOMES)?,
        })
    }

    /// Write the slots of service `index`'s table that differ from `old`.
    pub(crate) fn write_table(&mut self, index: u32, new: &[u32], old: Option<&[u32]>) -> anyhow::Result<()> {
        for (i, slot) in new.iter().enumerate() {
            if old.is_some_and(|o| o.get(i) == Some(slot)) {
                continue;
            }
            let at = index * TABLE_SIZE + u32::try_from(i)?;
            self.table.set(at, *slot, 0).on(maps::TUNNEL_TABLE)?;
        }
        Ok(())
    }

    /// Forget backend `index`'s next hop on every CPU (its address may
    /// have changed): the program looks it up again.
    pub(crate) fn forget_hop(&mut self, index: u32) -> anyhow::Result<()> {
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| e)?;
        let none = aya::maps::PerCpuValues::try_from(vec![Hop::default(); cpus])?;
        self.hops.set(index, none, 0).on(maps::TUNNEL_HOPS)?;
        Ok(())
    }

    /// Packets and bytes forwarded to backend `index`, over every CPU.
    pub(crate) fn hits(&self, index: u32) -> Counter {
        self.hits.get(&index, 0).map(|v| crate::dataplane::maps::sum_cpus(&v)).unwrap_or_default()
    }

    /// What a daemon before this one left in the maps (pinned, they
    /// outlive it): each backend index written (a nonzero address) and
    /// each service key with its table's index.
    pub(crate) fn left(&self) -> Left {
        let backends = (0..limiter_common::tunnel::MAX_BACKENDS)
            .filter_map(|i| self.backends.get(&i, 0).ok().map(|b| (i, b)))
            .filter(|(_, b)| b.addr != [0; 16])
            .collect();
        let services = self.services.iter().filter_map(Result::ok).map(|(k, v)| (k, v.index)).collect();
        Left { backends, services }
    }

    /// Each outcome's packets, over every CPU.
    pub(crate) fn outcomes(&self) -> Vec<u64> {
        (0..OUTCOMES).map(|i| self.outcomes.get(&i, 0).map_or(0, |v| v.iter().sum())).collect()
    }
}
