//! EAL's command line, built from the gateway's configuration, and its one initialisation per
//! process.

use std::ffi::{c_char, CString};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::{ffi, strerror, DpdkError};

/// What EAL is started with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EalOptions {
    /// CPUs of the workers; the first is EAL's main lcore (`-l`). Empty: CPU 0.
    pub cores: Vec<usize>,
    /// Memory EAL reserves at start, in MiB (`-m`); `None` lets EAL grow it from
    /// hugepages as needed (not possible with `no_huge`).
    pub memory_mb: Option<u32>,
    /// Runs without hugepages (`--no-huge`): slower TLB behaviour and no physical
    /// addresses, enough for vdevs such as `net_af_packet` and for tests.
    pub no_huge: bool,
    /// EAL's runtime directory name (`--file-prefix`), unique per process on a machine.
    pub file_prefix: String,
}

/// Whether `device` is a PCI address (`0000:03:00.0` or `03:00.0`) rather than a vdev.
pub fn is_pci(device: &str) -> bool {
    let parts: Vec<&str> = device.split(':').collect();
    let hex = |s: &str, n: usize| s.len() == n && s.chars().all(|c| c.is_ascii_hexdigit());
    let bdf = |bus: &str, devfn: &str| {
        hex(bus, 2)
            && devfn
                .split_once('.')
                .is_some_and(|(d, f)| hex(d, 2) && f.len() == 1 && f.as_bytes()[0].is_ascii_digit())
    };
    match parts.as_slice() {
        [dom, bus, devfn] => hex(dom, 4) && bdf(bus, devfn),
        [bus, devfn] => bdf(bus, devfn),
        _ => false,
    }
}

/// The ethdev name EAL gives `device`: the PCI address as written, or the vdev's driver
/// instance name (before the first comma).
pub fn device_port_name(device: &str) -> &str {
    if is_pci(device) {
        device
    } else {
        device.split(',').next().unwrap_or(device)
    }
}

/// EAL's arguments (after the program name) for `opts` and `devices`: `-l MAIN`,
/// `--file-prefix`, `-m`, `--no-huge`, `--no-pci` when no device is PCI, `-a` per PCI
/// device (only those are probed), `--vdev` per vdev, and `--no-telemetry` (the gateway's
/// metrics are its admin API's).
pub fn eal_args(opts: &EalOptions, devices: &[&str]) -> Vec<String> {
    let main = opts.cores.first().copied().unwrap_or(0);
    let mut a = vec![
        "-l".to_owned(),
        main.to_string(),
        format!("--file-prefix={}", opts.file_prefix),
        "--no-telemetry".to_owned(),
    ];
    if let Some(m) = opts.memory_mb {
        a.push("-m".to_owned());
        a.push(m.to_string());
    }
    if opts.no_huge {
        a.push("--no-huge".to_owned());
    }
    if !devices.iter().any(|d| is_pci(d)) {
        a.push("--no-pci".to_owned());
    }
    for d in devices {
        if is_pci(d) {
            a.push("-a".to_owned());
        } else {
            a.push("--vdev".to_owned());
        }
        a.push((*d).to_owned());
    }
    a
}

static INITIALISED: AtomicBool = AtomicBool::new(false);

/// `rte_eal_init` with `args` (program name added), once per process.
pub(crate) fn init(args: &[String]) -> Result<(), DpdkError> {
    if INITIALISED.swap(true, Ordering::SeqCst) {
        return Err(DpdkError::EalTwice);
    }
    let joined = args.join(" ");
    let owned: Vec<CString> = std::iter::once("strait")
        .chain(args.iter().map(String::as_str))
        .map(|s| {
            CString::new(s).map_err(|_| DpdkError::Eal {
                args: joined.clone(),
                reason: format!("argument {s:?} contains a NUL byte"),
            })
        })
        .collect::<Result<_, _>>()?;
    // EAL may permute argv; it gets pointers into `owned`, which outlives the call.
    let mut argv: Vec<*mut c_char> = owned.iter().map(|c| c.as_ptr().cast_mut()).collect();
    // SAFETY: `argv` holds `argc` pointers to NUL-terminated strings that live until the
    // end of this function; EAL reads them (and may reorder the pointer array) during the
    // call only, copying what it keeps.
    let r = unsafe { ffi::strait_eal_init(argv.len() as i32, argv.as_mut_ptr()) };
    if r < 0 {
        return Err(DpdkError::Eal {
            args: joined,
            reason: strerror(-r),
        });
    }
    Ok(())
}

/// `rte_eal_cleanup`, then EAL's runtime directory of this process (`/var/run/dpdk/PREFIX`,
/// which EAL leaves behind).
pub(crate) fn cleanup(file_prefix: &str) {
    // SAFETY: EAL was initialised by `init` and every port is closed (the caller's order).
    unsafe { ffi::strait_eal_cleanup() };
    if let Some(dir) = runtime_dir(file_prefix) {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// EAL's runtime directory for `file_prefix` when run as root (`/var/run/dpdk/PREFIX`); `None`
/// for a prefix that is not one directory name.
pub(crate) fn runtime_dir(file_prefix: &str) -> Option<std::path::PathBuf> {
    (!file_prefix.is_empty() && !file_prefix.contains('/') && file_prefix != "..")
        .then(|| std::path::Path::new("/var/run/dpdk").join(file_prefix))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_addresses_and_vdevs() {
        assert!(is_pci("0000:03:00.0"));
        assert!(is_pci("af:00.1"));
        assert!(!is_pci("net_af_packet0,iface=eth1"));
        assert!(!is_pci("net_tap0"));
        assert!(!is_pci("0000:03:00"));
        assert_eq!(
            device_port_name("net_af_packet0,iface=eth1"),
            "net_af_packet0"
        );
        assert_eq!(device_port_name("0000:03:00.0"), "0000:03:00.0");
    }

    #[test]
    fn eal_arguments() {
        let opts = EalOptions {
            cores: vec![3, 5],
            memory_mb: Some(1024),
            no_huge: true,
            file_prefix: "strait-42".into(),
        };
        assert_eq!(
            eal_args(&opts, &["net_af_packet0,iface=dp-gw"]).join(" "),
            "-l 3 --file-prefix=strait-42 --no-telemetry -m 1024 --no-huge --no-pci \
             --vdev net_af_packet0,iface=dp-gw"
        );
        let opts = EalOptions {
            cores: vec![],
            memory_mb: None,
            no_huge: false,
            file_prefix: "gw".into(),
        };
        assert_eq!(
            eal_args(&opts, &["0000:03:00.0", "net_tap0"]).join(" "),
            "-l 0 --file-prefix=gw --no-telemetry -a 0000:03:00.0 --vdev net_tap0"
        );
    }
}
