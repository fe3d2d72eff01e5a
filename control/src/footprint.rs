//! What a configuration will take in memory, computed from the configuration alone before
//! anything is allocated: `strait check` prints it, and `strait run` refuses a
//! configuration that would not fit in the machine's memory instead of failing (or being
//! killed) half-way through allocating its flow tables.
//!
//! The large parts are the ones each worker allocates up front so that the packet path never
//! allocates: its flow table, its UMEM, its hand-off rings and its capture ring; the Maglev
//! tables of the services, which the live table and the builder's cache may each hold; and
//! each AF_XDP interface's copy of its steering maps (in the kernel and in this process).

use std::fmt;

use strait_config::model::Config;
use strait_config::model::Driver;
use strait_dataplane::capture::RING_BYTES;
use strait_dataplane::flow::{BackendEntries, FlowTable, BACKEND_SLOTS};
use strait_dataplane::maglev;
use strait_dataplane::pipeline::NEW_FLOW_SLOTS;
use strait_dataplane::sync::{RECORD_BYTES, SYNC_SLOTS};
use strait_dataplane::traffic::Traffic;
use strait_dataplane::xsk::{
    HandoffConfig, FRAME_COUNT, FRAME_SIZE, HANDOFF_SLOTS, STEER_COPY_BYTES,
};

/// Bytes a configuration takes, by part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footprint {
    /// Workers: one per distinct queue index across the interfaces.
    pub workers: u64,
    /// Flow tables: one per worker, for `flow_capacity_per_core` flows.
    pub flow_tables: u64,
    /// UMEMs: one per worker, [`FRAME_COUNT`] frames of [`FRAME_SIZE`] bytes.
    pub umem: u64,
    /// Hand-off rings: one from every worker to every other.
    pub handoff: u64,
    /// Flow-sync rings (`[gateway.sync]`): two per worker, [`SYNC_SLOTS`] records of
    /// [`RECORD_BYTES`] each; zero without sync.
    pub sync: u64,
    /// Maglev tables of the configured services, twice: the live table's and the builder's
    /// copy for the next build.
    pub maglev: u64,
    /// Per-service and per-backend counters: per worker, its traffic slots
    /// ([`strait_dataplane::traffic`]), new flows per backend, failed connection attempts
    /// per backend ([`strait_dataplane::passive`]) and flow-table entries per backend.
    pub counters: u64,
    /// Capture rings (`strait capture`): one per worker, [`RING_BYTES`] each, allocated at
    /// start so that a capture allocates nothing on the workers' side.
    pub capture: u64,
    /// The steering program's copy of its frontend and nat-backend maps: one per AF_XDP
    /// interface, [`STEER_COPY_BYTES`] each (two arrays in the kernel, their shadow here).
    pub steering: u64,
}

impl Footprint {
    /// The footprint of `cfg`.
    pub fn of(cfg: &Config) -> Self {
        let mut queues: Vec<u32> = cfg
            .gateway
            .interfaces
            .iter()
            .flat_map(|i| i.queues.iter().copied())
            .collect();
        queues.sort_unstable();
        queues.dedup();
        let workers = queues.len() as u64;
        let handoff_slot = HandoffConfig::for_mtu(cfg.gateway.mtu).slot_bytes as u64;
        let maglev: u64 = cfg
            .services
            .iter()
            .map(|s| maglev::bytes_for(s.maglev_table_size))
            .sum();
        Footprint {
            workers,
            flow_tables: workers.saturating_mul(FlowTable::bytes_for(
                cfg.gateway.flow_capacity_per_core as usize,
            )),
            umem: workers.saturating_mul(u64::from(FRAME_COUNT) * u64::from(FRAME_SIZE)),
            handoff: workers
                .saturating_mul(workers.saturating_sub(1))
                .saturating_mul(u64::from(HANDOFF_SLOTS) * handoff_slot),
            sync: if cfg.gateway.sync.is_some() {
                workers.saturating_mul(2 * u64::from(SYNC_SLOTS) * RECORD_BYTES as u64)
            } else {
                0
            },
            maglev: maglev.saturating_mul(2),
            counters: workers.saturating_mul(
                Traffic::bytes()
                    + (NEW_FLOW_SLOTS * size_of::<u64>()) as u64
                    + (strait_dataplane::passive::SLOTS * size_of::<[u64; 2]>()) as u64
                    + (BACKEND_SLOTS * size_of::<BackendEntries>()) as u64,
            ),
            capture: workers.saturating_mul(RING_BYTES),
            steering: (cfg
                .gateway
                .interfaces
                .iter()
                .filter(|i| matches!(i.driver, Driver::AfXdp))
                .count() as u64)
                .saturating_mul(STEER_COPY_BYTES),
        }
    }

    /// Every part together.
    pub fn total(&self) -> u64 {
        self.flow_tables
            .saturating_add(self.umem)
            .saturating_add(self.handoff)
            .saturating_add(self.sync)
            .saturating_add(self.maglev)
            .saturating_add(self.counters)
            .saturating_add(self.capture)
            .saturating_add(self.steering)
    }

    /// Refuses a footprint larger than `available` bytes (the machine's memory), naming
    /// both.
    ///
    /// # Errors
    ///
    /// [`TooLarge`] when [`Footprint::total`] exceeds `available`.
    pub fn fits(&self, available: u64) -> Result<(), TooLarge> {
        if self.total() > available {
            return Err(TooLarge {
                footprint: *self,
                available,
            });
        }
        Ok(())
    }
}

/// A configuration that needs more memory than the machine has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the configuration needs {} of memory ({footprint}), more than this machine's {}; \
     lower gateway.flow_capacity_per_core, the queues or the services' maglev_table_size",
    mib(footprint.total()),
    mib(*available)
)]
pub struct TooLarge {
    /// What the configuration takes.
    pub footprint: Footprint,
    /// What the machine has.
    pub available: u64,
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

impl fmt::Display for Footprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} worker{}: flow tables {}, UMEM {}, hand-off rings {}",
            self.workers,
            if self.workers == 1 { "" } else { "s" },
            mib(self.flow_tables),
            mib(self.umem),
            mib(self.handoff),
        )?;
        if self.sync > 0 {
            write!(f, ", flow-sync rings {}", mib(self.sync))?;
        }
        write!(
            f,
            ", capture rings {}; Maglev tables {}; counters {}",
            mib(self.capture),
            mib(self.maglev),
            mib(self.counters)
        )?;
        if self.steering > 0 {
            write!(f, "; steering copies {}", mib(self.steering))?;
        }
        Ok(())
    }
}

/// The machine's memory (`MemTotal` of `/proc/meminfo`), if it can be read.
pub fn machine_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use strait_testkit::config::{GatewayToml, ServiceToml};

    /// Interfaces `a` and `b`, each with `queues`, and one service with a full-size table.
    fn config(flow_capacity_per_core: u32, queues: &[u32]) -> Config {
        let toml = GatewayToml::new()
            .set("flow_capacity_per_core", flow_capacity_per_core)
            .interface("a", queues)
            .interface("b", queues)
            .service(ServiceToml::new("web", "203.0.113.10", 80).maglev_table_size(65537));
        strait_config::parse(&toml.to_string()).expect("valid")
    }

    #[test]
    fn counts_one_worker_per_queue_index_and_each_part() {
        let f = Footprint::of(&config(1_048_576, &[0, 1]));
        assert_eq!(
            f.workers, 2,
            "queues 0 and 1 on two interfaces are two workers"
        );
        // 1M flows: 131072 buckets of 8 64-byte entries, and a 64-byte tag line per 4 buckets.
        assert_eq!(f.flow_tables, 2 * (131_072 * 8 * 64 + 131_072 / 4 * 64));
        assert_eq!(f.umem, 2 * 4096 * 4096);
        assert_eq!(f.maglev, 2 * 65_537 * 2);
        assert!(f.handoff > 0);
        // Per worker, 65,536 ids of backends and of services' retired counts (4 bytes of
        // incarnation, 16 per direction), backends' services (8), new flows (8), failed
        // connection attempts (16) and flow-table entries (8).
        assert_eq!(f.counters, 2 * 65_536 * (2 * (4 + 2 * 16) + 8 + 8 + 16 + 8));
        // Two AF_XDP interfaces: two arrays of 2^18 24-byte slots each in the kernel, and
        // their 20-byte shadow.
        assert_eq!(f.steering, 2 * (2 * 262_144 * 24 + 262_144 * 20));
        assert_eq!(
            f.total(),
            f.flow_tables
                + f.umem
                + f.handoff
                + f.sync
                + f.maglev
                + f.counters
                + f.capture
                + f.steering,
            "{f}"
        );
    }

    #[test]
    fn a_footprint_beyond_the_machine_is_refused_naming_both() {
        let f = Footprint::of(&config(268_435_456, &[0, 1, 2, 3]));
        let err = f
            .fits(8 << 30)
            .expect_err("4 x 256M flows do not fit in 8 GiB");
        let text = err.to_string();
        assert!(text.contains("8192.0 MiB"), "{text}");
        assert!(text.contains("flow_capacity_per_core"), "{text}");
        assert!(f.fits(u64::MAX).is_ok());
    }

    #[test]
    fn this_machine_reports_its_memory() {
        assert!(machine_memory().is_some_and(|m| m > 64 << 20));
    }
}
