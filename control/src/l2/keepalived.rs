//! keepalived's configuration for `[gateway.l2]`: one VRRP instance per (family, virtual
//! router id) in use, each VIP in the instance its hash picks, each instance ranking the
//! members its own way (rendezvous hashing), the same on every gateway. So with three
//! gateways and many VIPs each gateway owns about a third of them, and the loss of one
//! moves only its third.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;

use strait_config::model::L2;

/// Priority of the first-ranked member; each next one is 10 lower (keepalived's own
/// address-owner priority, 255, is never used).
const TOP_PRIORITY: u32 = 250;

/// FNV-1a, 64 bits, then MurmurHash3's 64-bit finalizer (FNV alone spreads short, similar
/// names such as `gw1`, `gw2` poorly): stable across processes and builds (unlike std's
/// `DefaultHasher`), so every gateway computes the same ids and ranks.
fn fnv(bytes: &[u8]) -> u64 {
    let mut h = bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The virtual router id (1..=255) that carries `vip`.
pub fn vrid(vip: IpAddr) -> u8 {
    let bytes = match vip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    // 255 ids, 1..=255: the remainder fits a u8.
    1 + u8::try_from(fnv(&bytes) % 255).unwrap_or(0)
}

/// This gateway's VRRP priority in instance `vrid`: the members ranked by a hash of
/// (`vrid`, member), highest first.
pub fn priority(l2: &L2, vrid: u8) -> u32 {
    let score = |m: &str| fnv(format!("{vrid}/{m}").as_bytes());
    let mine = score(&l2.name);
    let above = l2
        .members
        .iter()
        .filter(|m| **m != l2.name)
        .filter(|m| {
            let s = score(m);
            // Ties (a 2^-64 event) go to the smaller name.
            s > mine || (s == mine && m.as_str() < l2.name.as_str())
        })
        .count();
    TOP_PRIORITY - 10 * u32::try_from(above).unwrap_or(0)
}

/// keepalived's configuration for `l2` on `interface`, owning `vips` (sorted).
pub fn config(l2: &L2, interface: &str, vips: &[IpAddr]) -> String {
    let mut instances: BTreeMap<(bool, u8), Vec<IpAddr>> = BTreeMap::new();
    for &v in vips {
        instances.entry((v.is_ipv6(), vrid(v))).or_default().push(v);
    }
    let advert = l2.advert_interval.as_millis() as f64 / 1000.0;
    let mut c = String::new();
    let _ = writeln!(c, "# Written by strait; rewritten when the VIPs change.");
    let _ = writeln!(c, "global_defs {{");
    let _ = writeln!(c, "  router_id strait_{}", l2.name);
    let _ = writeln!(c, "  vrrp_version 3");
    // Gratuitous ARP / unsolicited NA: at once on taking over, again a second later for
    // neighbours that missed it, and every 10 s while owning.
    let _ = writeln!(c, "  vrrp_garp_master_delay 1");
    let _ = writeln!(c, "  vrrp_garp_master_repeat 3");
    let _ = writeln!(c, "  vrrp_garp_master_refresh 10");
    let _ = writeln!(c, "  max_auto_priority -1");
    let _ = writeln!(c, "}}");
    for ((v6, id), addrs) in &instances {
        let family = if *v6 { "v6" } else { "v4" };
        let _ = writeln!(c, "vrrp_instance strait_{family}_{id} {{");
        let _ = writeln!(c, "  state BACKUP");
        let _ = writeln!(c, "  interface {interface}");
        let _ = writeln!(c, "  virtual_router_id {id}");
        let _ = writeln!(c, "  priority {}", priority(l2, *id));
        let _ = writeln!(c, "  advert_int {advert}");
        if *v6 {
            let _ = writeln!(c, "  native_ipv6");
        }
        let _ = writeln!(c, "  virtual_ipaddress {{");
        for a in addrs {
            let len = if a.is_ipv6() { 128 } else { 32 };
            let _ = writeln!(c, "    {a}/{len}");
        }
        let _ = writeln!(c, "  }}");
        let _ = writeln!(c, "}}");
    }
    c
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use super::*;

    fn l2(name: &str, members: &[&str]) -> L2 {
        L2 {
            name: name.to_owned(),
            members: members.iter().map(|m| (*m).to_owned()).collect(),
            advert_interval: Duration::from_millis(100),
            daemon: L2::DEFAULT_DAEMON.into(),
        }
    }

    #[test]
    fn every_instance_has_one_top_member_and_owners_spread() {
        let members = ["gw1", "gw2", "gw3"];
        let mut owned = BTreeMap::<&str, usize>::new();
        for id in 1..=255u8 {
            let prios: Vec<u32> = members
                .iter()
                .map(|m| priority(&l2(m, &members), id))
                .collect();
            let mut sorted = prios.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, [230, 240, 250], "instance {id}: {prios:?}");
            let top = members[prios.iter().position(|&p| p == 250).unwrap()];
            *owned.entry(top).or_default() += 1;
        }
        // About a third each (85 of 255; a loose bound for a hash).
        for (m, n) in &owned {
            assert!((55..=115).contains(n), "{m} owns {n} of 255: {owned:?}");
        }
    }

    #[test]
    fn config_groups_vips_by_family_and_instance() {
        let vips: Vec<IpAddr> = ["203.0.113.10", "203.0.113.11", "2001:db8::10"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        let c = config(&l2("gw1", &["gw1", "gw2"]), "veth-gw", &vips);
        assert!(c.contains("vrrp_version 3"), "{c}");
        assert!(c.contains("advert_int 0.1"), "{c}");
        assert!(c.contains("    203.0.113.10/32"), "{c}");
        assert!(c.contains("    2001:db8::10/128"), "{c}");
        assert!(
            c.contains(&format!("vrrp_instance strait_v6_{} {{", vrid(vips[2]))),
            "{c}"
        );
        assert!(c.contains("native_ipv6"), "{c}");
        assert_eq!(
            c.matches("interface veth-gw").count(),
            c.matches("vrrp_instance").count()
        );
    }

    /// keepalived itself accepts what we write (`keepalived -t`), when it is installed.
    #[test]
    fn keepalived_accepts_the_configuration() {
        let daemon = Path::new(L2::DEFAULT_DAEMON);
        if !daemon.exists() {
            eprintln!("skipped: {} not installed", daemon.display());
            return;
        }
        let vips: Vec<IpAddr> = ["203.0.113.10", "2001:db8::10"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        // keepalived wants a real interface that does multicast (it is only read, never
        // changed).
        use nix::net::if_::InterfaceFlags;
        let Some(iface) = nix::ifaddrs::getifaddrs()
            .unwrap()
            .find(|a| {
                a.flags.contains(InterfaceFlags::IFF_MULTICAST)
                    && !a.flags.contains(InterfaceFlags::IFF_LOOPBACK)
            })
            .map(|a| a.interface_name)
        else {
            eprintln!("skipped: no multicast interface");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("keepalived.conf");
        std::fs::write(&file, config(&l2("gw1", &["gw1", "gw2"]), &iface, &vips)).unwrap();
        let out = std::process::Command::new(daemon)
            .arg("-t")
            .arg("-f")
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "keepalived -t refused:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
