//! The benchmark's sink (`bpf/sink.bpf.c`): an XDP program that counts every frame arriving on
//! an interface and drops it, reflecting latency probes back out of the same interface
//! (Ethernet and IPv4 addresses and UDP ports swapped, checksums valid as they are). `strait
//! sink` drives it.
//!
//! Counting in XDP costs a per-CPU increment per frame, far less than the forwarder under test
//! spends, so the sink never is the bottleneck it measures.
//!
//! Reflection is `bpf_redirect` to the ingress interface, not `XDP_TX`: on a veth an `XDP_TX`
//! frame reaches the peer only if the peer runs an XDP program, while a redirect reaches it
//! whenever the peer has NAPI, which GRO gives too. So the peer (the forwarder's backend-side
//! interface) needs an XDP program or `ethtool -K PEER gro on`; otherwise the kernel drops the
//! reflections (this interface's `ethtool -S` counts them in `rx_queue_N_drops`).

use libbpf_rs::{MapCore, MapFlags, MapHandle};

use strait_dataplane::xsk::{Aligned, AttachMode, AttachPolicy, XdpProgram, XskError};

use strait_dataplane::embedded_object;

/// The compiled program, `bpf/sink.bpf.c`.
static OBJECT: &Aligned<[u8]> = embedded_object!("sink");

/// Name of the XDP function in `sink.bpf.c`.
const PROGRAM: &str = "strait_sink";

/// The sink's counters, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SinkCounters {
    /// Frames that arrived, probes included.
    pub received: u64,
    /// Probes sent back (a subset of `received`): redirected to the ingress interface; the
    /// kernel may still drop one there (see the module documentation).
    pub reflected: u64,
}

/// The sink program, loaded and attached to one interface; detached on drop.
#[derive(Debug)]
pub struct SinkProgram {
    prog: XdpProgram,
    counters: MapHandle,
}

impl SinkProgram {
    /// Loads the sink, sets its reflect port (`None`: count and drop everything), removes any
    /// XDP program already on `iface` and attaches the sink as `policy` allows (`strait-lab sink`
    /// asks for native mode only). The interface is looked up in the calling thread's network
    /// namespace.
    ///
    /// # Errors
    /// [`XskError::NoInterface`]; [`XskError::Config`] for reflect port 0; [`XskError::Bpf`]
    /// when loading, the config map update or detaching a stale program fails;
    /// [`XskError::Attach`] when no allowed mode attaches.
    pub fn attach(
        iface: &str,
        reflect_port: Option<u16>,
        policy: AttachPolicy,
    ) -> Result<Self, XskError> {
        if reflect_port == Some(0) {
            return Err(XskError::Config(
                "reflect port 0: probes come from a real UDP port (1-65535)".to_owned(),
            ));
        }
        let mut prog = XdpProgram::load(&OBJECT.0, PROGRAM, iface)?;
        let counters = prog.map("counters")?;
        let config = prog.map("config")?;
        let port = u32::from(reflect_port.unwrap_or(0));
        config
            .update(&0u32.to_ne_bytes(), &port.to_ne_bytes(), MapFlags::ANY)
            .map_err(|source| XskError::Bpf {
                iface: iface.to_owned(),
                call: "update config",
                source,
            })?;
        prog.attach(policy)?;
        Ok(Self { prog, counters })
    }

    /// The mode the program is attached in.
    pub fn mode(&self) -> AttachMode {
        self.prog.mode().unwrap_or(AttachMode::Native)
    }

    /// Ids of the programs found on the interface and removed by [`Self::attach`].
    pub fn replaced_programs(&self) -> &[u32] {
        self.prog.replaced()
    }

    /// The kernel's id of the program.
    pub fn program_id(&self) -> u32 {
        self.prog.id()
    }

    /// The interface the sink is on.
    pub fn iface(&self) -> &str {
        self.prog.iface()
    }

    /// The counters, summed over CPUs. Two per-CPU map reads; call it a few times a second,
    /// not per packet.
    ///
    /// # Errors
    /// [`XskError::Bpf`] if the per-CPU lookup fails.
    pub fn counters(&self) -> Result<SinkCounters, XskError> {
        let mut v = [0u64; 2];
        for (slot, out) in v.iter_mut().enumerate() {
            *out = sum_per_cpu(&self.counters, slot as u32).map_err(|source| XskError::Bpf {
                iface: self.prog.iface().to_owned(),
                call: "lookup counters",
                source,
            })?;
        }
        Ok(SinkCounters {
            received: v[0],
            reflected: v[1],
        })
    }
}

/// Slot `slot` of a per-CPU array of `u64`, summed over CPUs.
fn sum_per_cpu(map: &MapHandle, slot: u32) -> Result<u64, libbpf_rs::Error> {
    let per_cpu = map
        .lookup_percpu(&slot.to_ne_bytes(), MapFlags::ANY)?
        .unwrap_or_default();
    Ok(per_cpu
        .iter()
        .filter_map(|b| b.get(..8))
        .map(|b| u64::from_ne_bytes(b.try_into().unwrap_or([0; 8])))
        .sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_is_embedded() {
        crate::assert_embedded(&OBJECT.0);
    }

    #[test]
    fn reflect_port_zero_is_refused_before_any_syscall() {
        let e = SinkProgram::attach("strait-nope0", Some(0), AttachPolicy::NativeOnly)
            .expect_err("port 0");
        assert!(matches!(e, XskError::Config(_)), "{e:?}");
    }

    #[test]
    fn a_missing_interface_is_named() {
        let e = SinkProgram::attach("strait-nope0", None, AttachPolicy::NativeOnly)
            .expect_err("no such interface");
        assert!(e.to_string().contains("strait-nope0"), "{e}");
    }
}
