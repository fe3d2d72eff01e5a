//! Loading an embedded XDP object, attaching its program to one interface through netlink, and
//! taking it off again on drop: what every XDP program shares (the gateway's steering
//! program, [`super::SteerProgram`]; the lab's sink and `limit` forwarder load theirs with
//! it too). A program left on the interface by an earlier run (netlink-attached
//! programs outlive a crashed process) is removed first, and [`Drop`] detaches ours only if
//! it is still the one on the interface.

use std::os::fd::AsFd;

use libbpf_rs::{MapCore, MapHandle, Object, ObjectBuilder, Xdp, XdpFlags};

use super::{ifindex, XskError};

/// How the program is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachMode {
    /// In the driver (`XDP_FLAGS_DRV_MODE`), before an skb exists.
    Native,
    /// Generic XDP (`XDP_FLAGS_SKB_MODE`), after the skb is built; works on every interface,
    /// slower.
    Generic,
}

/// Which attach modes to try.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttachPolicy {
    /// Native, falling back to generic.
    #[default]
    NativeOrGeneric,
    /// Native or fail.
    NativeOnly,
    /// Generic only.
    GenericOnly,
}

/// Bytes aligned to 8, as libelf wants an object in memory.
#[repr(C, align(8))]
pub struct Aligned<T: ?Sized>(pub T);

impl std::fmt::Debug for Aligned<[u8]> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Aligned({} bytes)", self.0.len())
    }
}

/// The object `NAME.bpf.o` that the calling crate's build script compiled into its
/// `OUT_DIR` (`env!` expands where the macro is used), embedded as
/// `&strait_dataplane::xsk::Aligned<[u8]>` for [`XdpProgram::load`].
#[macro_export]
macro_rules! embedded_object {
    ($name:literal) => {
        &$crate::xsk::Aligned(*include_bytes!(concat!(
            env!("OUT_DIR"),
            "/",
            $name,
            ".bpf.o"
        )))
    };
}

/// Checks an embedded object: an ELF file, 8-byte aligned.
#[cfg(test)]
pub(crate) fn assert_embedded(object: &[u8]) {
    assert_eq!(&object[..4], b"\x7fELF");
    assert_eq!(object.as_ptr() as usize % 8, 0);
}

/// An XDP program loaded from an embedded object, attached to one interface.
#[derive(Debug)]
pub struct XdpProgram {
    obj: Object,
    program: &'static str,
    iface: String,
    ifindex: i32,
    prog_id: u32,
    /// `None` until [`Self::attach`] succeeds.
    mode: Option<AttachMode>,
    replaced: Vec<u32>,
}

impl XdpProgram {
    /// Loads `object` (an ELF file, 8-byte aligned) into the kernel for interface `iface` (looked
    /// up in the calling thread's network namespace). Nothing is attached yet: set up the maps
    /// ([`Self::map`]), then [`Self::attach`].
    ///
    /// # Errors
    /// [`XskError::NoInterface`]; [`XskError::Bpf`] when opening or loading fails (the
    /// verifier's log is on stderr) or the object has no program `program`.
    pub fn load(object: &[u8], program: &'static str, iface: &str) -> Result<Self, XskError> {
        let ifindex = ifindex(iface)? as i32;
        let bpf = |call: &'static str| {
            move |source| XskError::Bpf {
                iface: iface.to_owned(),
                call,
                source,
            }
        };
        let obj = ObjectBuilder::default()
            .open_memory(object)
            .map_err(bpf("bpf_object__open_mem"))?
            .load()
            .map_err(bpf("bpf_object__load"))?;
        let prog_id = {
            let prog = obj
                .progs()
                .find(|p| p.name() == program)
                .ok_or_else(|| XskError::Bpf {
                    iface: iface.to_owned(),
                    call: "find program",
                    source: std::io::Error::new(std::io::ErrorKind::NotFound, program).into(),
                })?;
            libbpf_rs::Program::id_from_fd(prog.as_fd()).map_err(bpf("prog id"))?
        };
        Ok(Self {
            obj,
            program,
            iface: iface.to_owned(),
            ifindex,
            prog_id,
            mode: None,
            replaced: Vec::new(),
        })
    }

    /// A handle on the object's map `name`.
    ///
    /// # Errors
    /// [`XskError::Bpf`] when the object has no such map or its descriptor cannot be
    /// duplicated.
    pub fn map(&self, name: &'static str) -> Result<MapHandle, XskError> {
        let m = self
            .obj
            .maps()
            .find(|m| m.name() == name)
            .ok_or_else(|| XskError::Bpf {
                iface: self.iface.clone(),
                call: "find map",
                source: std::io::Error::new(std::io::ErrorKind::NotFound, name).into(),
            })?;
        MapHandle::try_from(&m).map_err(|source| XskError::Bpf {
            iface: self.iface.clone(),
            call: "dup map fd",
            source,
        })
    }

    /// Runs the program once on `frame` (`BPF_PROG_TEST_RUN`, nothing sent) and returns its
    /// XDP action.
    ///
    /// # Errors
    /// [`XskError::Bpf`] when the kernel refuses the run.
    pub fn test_run(&mut self, frame: &[u8]) -> Result<u32, XskError> {
        let iface = &self.iface;
        let bpf = |source| XskError::Bpf {
            iface: iface.clone(),
            call: "test run",
            source,
        };
        let name = self.program;
        let prog = self
            .obj
            .progs_mut()
            .find(|p| p.name() == name)
            .ok_or_else(|| bpf(std::io::Error::new(std::io::ErrorKind::NotFound, name).into()))?;
        let input = libbpf_rs::ProgramInput {
            data_in: Some(frame),
            ..Default::default()
        };
        prog.test_run(input).map(|o| o.return_value).map_err(bpf)
    }

    /// Removes whatever XDP program is on the interface (in either mode) and attaches ours as
    /// `policy` allows.
    ///
    /// # Errors
    /// [`XskError::Bpf`] when querying the interface or detaching the stale program fails;
    /// [`XskError::Attach`] when no allowed mode attaches.
    pub fn attach(&mut self, policy: AttachPolicy) -> Result<AttachMode, XskError> {
        let iface = self.iface.as_str();
        let bpf = |call: &'static str| {
            move |source| XskError::Bpf {
                iface: iface.to_owned(),
                call,
                source,
            }
        };
        let prog = self
            .obj
            .progs()
            .find(|p| p.name() == self.program)
            .ok_or_else(|| XskError::Bpf {
                iface: iface.to_owned(),
                call: "find program",
                source: std::io::Error::new(std::io::ErrorKind::NotFound, self.program).into(),
            })?;
        let xdp = Xdp::new(prog.as_fd());
        let q = xdp
            .query(self.ifindex, XdpFlags::NONE)
            .map_err(bpf("bpf_xdp_query"))?;
        for (id, flags) in [
            (q.drv_prog_id, XdpFlags::DRV_MODE),
            (q.skb_prog_id, XdpFlags::SKB_MODE),
        ] {
            if id != 0 {
                xdp.detach(self.ifindex, flags)
                    .map_err(bpf("bpf_xdp_detach (stale program)"))?;
                self.replaced.push(id);
            }
        }
        let try_mode = |flags: XdpFlags| {
            xdp.attach(self.ifindex, flags | XdpFlags::UPDATE_IF_NOEXIST)
                .map_err(|e| e.to_string())
        };
        let not_tried = || "not tried".to_owned();
        let native = match policy {
            AttachPolicy::GenericOnly => Err(not_tried()),
            _ => try_mode(XdpFlags::DRV_MODE),
        };
        let mode = match native {
            Ok(()) => AttachMode::Native,
            Err(native) if policy == AttachPolicy::NativeOnly => {
                return Err(XskError::Attach {
                    iface: iface.to_owned(),
                    native,
                    generic: not_tried(),
                })
            }
            Err(native) => match try_mode(XdpFlags::SKB_MODE) {
                Ok(()) => AttachMode::Generic,
                Err(generic) => {
                    return Err(XskError::Attach {
                        iface: iface.to_owned(),
                        native,
                        generic,
                    })
                }
            },
        };
        self.mode = Some(mode);
        Ok(mode)
    }

    /// The mode the program is attached in (`None` before [`Self::attach`]).
    pub fn mode(&self) -> Option<AttachMode> {
        self.mode
    }

    /// Ids of the programs found on the interface and removed by [`Self::attach`].
    pub fn replaced(&self) -> &[u32] {
        &self.replaced
    }

    /// The kernel's id of our program.
    pub fn id(&self) -> u32 {
        self.prog_id
    }

    /// The interface name.
    pub fn iface(&self) -> &str {
        &self.iface
    }
}

impl Drop for XdpProgram {
    fn drop(&mut self) {
        if self.mode.is_none() {
            return;
        }
        let Some(prog) = self.obj.progs().find(|p| p.name() == self.program) else {
            return;
        };
        let xdp = Xdp::new(prog.as_fd());
        // Only our own program comes off; the interface may be gone already (its namespace
        // deleted), which needs nothing.
        if let Ok(q) = xdp.query(self.ifindex, XdpFlags::NONE) {
            if q.drv_prog_id == self.prog_id {
                let _ = xdp.detach(self.ifindex, XdpFlags::DRV_MODE);
            }
            if q.skb_prog_id == self.prog_id {
                let _ = xdp.detach(self.ifindex, XdpFlags::SKB_MODE);
            }
        }
    }
}
