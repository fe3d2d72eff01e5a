//! BIRD 2: the configuration the gateway gives its speaker, and BIRD's control socket.
//!
//! The configuration announces each VIP as a static blackhole route (a /32 or /128 that
//! exists only to be exported) to every peer over a BGP session of the peer's family. It
//! has no `kernel` protocol, so BIRD never touches the gateway's own routing table, and it
//! imports nothing. Graceful restart is off: a peer must drop this gateway's routes the
//! moment the session ends (a killed gateway), not keep them as stale for minutes.
//!
//! The control socket speaks lines of a four-digit code, then `-` (more follows) or a
//! space (the last line); lines that start with a space continue the previous code.
//! Codes from 8000 up are errors (`doc/reply_codes` in BIRD's source).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::net::IpAddr;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};
use strait_config::model::{Bgp, BgpPeer, RouteAttrs};

/// The name of the BIRD protocol of peer `i` (`peers[i]`).
pub fn protocol_name(i: usize) -> String {
    format!("peer{i}")
}

/// BIRD's configuration for `bgp`, announcing `announced` (sorted), each route with the
/// attributes `attrs` gives its VIP (if any) on top of the gateway-wide communities.
pub fn config(bgp: &Bgp, announced: &[IpAddr], attrs: &BTreeMap<IpAddr, RouteAttrs>) -> String {
    let mut c = String::new();
    // Writing to a String cannot fail.
    let _ = writeln!(c, "# Written by strait; rewritten on every route change.");
    let _ = writeln!(c, "router id {};", bgp.router_id);
    let _ = writeln!(
        c,
        "log stderr {{ info, remote, warning, error, auth, fatal, bug }};"
    );
    let _ = writeln!(c, "protocol device {{ scan time 10; }}");
    for (name, v6) in [("strait_v4", false), ("strait_v6", true)] {
        let _ = writeln!(c, "protocol static {name} {{");
        let _ = writeln!(c, "  {};", if v6 { "ipv6" } else { "ipv4" });
        for vip in announced.iter().filter(|a| a.is_ipv6() == v6) {
            let len = if v6 { 128 } else { 32 };
            match attrs.get(vip).filter(|a| !a.is_empty()) {
                None => {
                    let _ = writeln!(c, "  route {vip}/{len} blackhole;");
                }
                Some(a) => {
                    let _ = writeln!(c, "  route {vip}/{len} blackhole {{{} }};", route_attrs(a));
                }
            }
        }
        let _ = writeln!(c, "}}");
    }
    if bgp.peers.iter().any(|p| p.bfd) {
        // 100 ms x 3: a dead peer or gateway is found in 300 ms.
        let _ = writeln!(
            c,
            "protocol bfd {{ interface \"*\" {{ min rx interval 100 ms; min tx interval 100 ms; multiplier 3; }}; }}"
        );
    }
    let mut communities = String::new();
    for (asn, value) in &bgp.communities {
        let _ = write!(communities, " bgp_community.add(({asn}, {value}));");
    }
    for (i, p) in bgp.peers.iter().enumerate() {
        peer(&mut c, bgp, i, p, &communities);
    }
    c
}

/// The filter commands that set `a` on a static route: BIRD keeps them on the route, so
/// every peer's export sees them (LOCAL_PREF leaves over iBGP sessions only; an eBGP
/// session drops it, as RFC 4271 section 5.1.5 says).
fn route_attrs(a: &RouteAttrs) -> String {
    let mut s = String::new();
    for (asn, value) in &a.communities {
        let _ = write!(s, " bgp_community.add(({asn}, {value}));");
    }
    for (g, l1, l2) in &a.large_communities {
        let _ = write!(s, " bgp_large_community.add(({g}, {l1}, {l2}));");
    }
    if let Some(p) = a.local_pref {
        let _ = write!(s, " bgp_local_pref = {p};");
    }
    s
}

fn peer(c: &mut String, bgp: &Bgp, i: usize, p: &BgpPeer, communities: &str) {
    let (channel, source) = if p.address.is_ipv6() {
        ("ipv6", "strait_v6")
    } else {
        ("ipv4", "strait_v4")
    };
    let _ = writeln!(c, "protocol bgp {} {{", protocol_name(i));
    let _ = writeln!(c, "  local as {};", bgp.asn);
    let _ = writeln!(c, "  neighbor {} port {} as {};", p.address, p.port, p.asn);
    let hold = p.hold_time.as_secs();
    let _ = writeln!(c, "  hold time {hold};");
    if hold > 0 {
        let _ = writeln!(c, "  keepalive time {};", (hold / 3).max(1));
    }
    // A retry soon after a refused or lost connection, not BIRD's default 120 s.
    let _ = writeln!(c, "  connect retry time 1;");
    let _ = writeln!(c, "  error wait time 1, 10;");
    let _ = writeln!(c, "  graceful restart off;");
    if let Some(pw) = &p.password {
        // Validation keeps `"` and `\` out of passwords.
        let _ = writeln!(c, "  password \"{pw}\";");
    }
    if p.bfd {
        let _ = writeln!(c, "  bfd on;");
    }
    let _ = writeln!(c, "  {channel} {{");
    let _ = writeln!(c, "    import none;");
    let _ = writeln!(
        c,
        "    export filter {{ if proto = \"{source}\" then {{{communities} accept; }} reject; }};"
    );
    if p.asn == bgp.asn {
        let _ = writeln!(c, "    next hop self;");
    }
    let _ = writeln!(c, "  }};");
    let _ = writeln!(c, "}}");
}

/// A connection to BIRD's control socket.
#[derive(Debug)]
pub struct BirdSocket {
    reader: BufReader<UnixStream>,
}

/// One protocol's line of `show protocols`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Protocol {
    /// BIRD's name of it.
    pub name: String,
    /// `up`, `start`, `down`...
    pub state: String,
    /// For BGP: `Established`, `Active`, `Connect`..., and the last error.
    pub info: String,
}

impl BirdSocket {
    /// Connects to the socket at `path` and reads BIRD's greeting.
    ///
    /// # Errors
    /// When nothing listens there, or BIRD does not greet.
    pub fn connect(path: &Path) -> anyhow::Result<Self> {
        let stream = UnixStream::connect(path)
            .with_context(|| format!("connecting to BIRD at {}", path.display()))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        stream.set_write_timeout(Some(Duration::from_secs(5)))?;
        let mut c = Self {
            reader: BufReader::new(stream),
        };
        c.reply().context("BIRD's greeting")?;
        Ok(c)
    }

    /// Sends `command` and returns its reply's lines (code, text).
    ///
    /// # Errors
    /// A lost socket, or an error code in the reply (its text).
    pub fn command(&mut self, command: &str) -> anyhow::Result<Vec<(u16, String)>> {
        let stream = self.reader.get_mut();
        stream.write_all(command.as_bytes())?;
        stream.write_all(b"\n")?;
        self.reply()
    }

    /// Reads one whole reply.
    fn reply(&mut self) -> anyhow::Result<Vec<(u16, String)>> {
        let mut lines = Vec::new();
        let mut code = 0;
        loop {
            let mut line = String::new();
            if self.reader.read_line(&mut line)? == 0 {
                bail!("BIRD closed its control socket");
            }
            let line = line.trim_end_matches('\n');
            if let Some(rest) = line.strip_prefix(' ') {
                lines.push((code, rest.to_owned()));
                continue;
            }
            let (digits, rest) = line.split_at(line.len().min(4));
            code = digits
                .parse()
                .with_context(|| format!("BIRD sent {line:?}"))?;
            let last = !rest.starts_with('-');
            lines.push((code, rest.get(1..).unwrap_or_default().to_owned()));
            if last {
                break;
            }
        }
        if let Some((c, text)) = lines.iter().find(|(c, _)| *c >= 8000) {
            bail!("BIRD refused ({c}): {text}");
        }
        Ok(lines)
    }

    /// Re-reads the configuration file (the routes changed).
    ///
    /// # Errors
    /// BIRD's refusal.
    pub fn configure(&mut self) -> anyhow::Result<()> {
        self.command("configure").map(drop)
    }

    /// The protocols and their states.
    ///
    /// # Errors
    /// A lost socket.
    pub fn protocols(&mut self) -> anyhow::Result<Vec<Protocol>> {
        let lines = self.command("show protocols")?;
        Ok(lines
            .iter()
            .filter(|(code, _)| *code == 1002)
            .filter_map(|(_, text)| parse_protocol(text))
            .collect())
    }

    /// Shuts BIRD down: it closes its sessions with a Cease notification, so the peers drop
    /// the routes at once.
    ///
    /// # Errors
    /// A lost socket.
    pub fn down(&mut self) -> anyhow::Result<()> {
        // BIRD answers 0013 and closes the socket as it exits.
        match self.command("down") {
            Ok(_) => Ok(()),
            Err(e) if e.to_string().contains("closed") => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// `peer0    BGP    ---    up    12:00:00.000    Established` (name, protocol, table,
/// state, since, info).
fn parse_protocol(text: &str) -> Option<Protocol> {
    let mut fields = text.split_whitespace();
    let name = fields.next()?.to_owned();
    let _proto = fields.next()?;
    let _table = fields.next()?;
    let state = fields.next()?.to_owned();
    // "since" is a time, or a date and a time.
    let rest: Vec<&str> = fields.collect();
    let skip = rest
        .iter()
        .take_while(|f| f.chars().next().is_some_and(|c| c.is_ascii_digit()))
        .count();
    let info = rest[skip..].join(" ");
    Some(Protocol { name, state, info })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bgp(peers: &str) -> Bgp {
        let text = format!(
            "[gateway.bgp]\nasn = 64512\nrouter_id = \"192.0.2.1\"\ncommunities = [\"64512:7\"]\n{peers}\n[[gateway.interfaces]]\nname = \"eth0\"\nqueues = [0]\n"
        );
        strait_config::parse(&text)
            .expect("valid")
            .gateway
            .bgp
            .expect("bgp")
    }

    #[test]
    fn config_announces_each_vip_to_the_peers_of_its_family() {
        let b = bgp("[[gateway.bgp.peers]]\naddress = \"198.51.100.1\"\nasn = 64500\nbfd = true\npassword = \"pw\"\n[[gateway.bgp.peers]]\naddress = \"2001:db8::1\"\nasn = 64512\nhold_time = \"0s\"\n");
        let vips: Vec<IpAddr> = vec![
            "203.0.113.10".parse().unwrap(),
            "2001:db8:1::5".parse().unwrap(),
        ];
        let c = config(&b, &vips, &BTreeMap::new());
        assert!(c.contains("route 203.0.113.10/32 blackhole;"), "{c}");
        assert!(c.contains("route 2001:db8:1::5/128 blackhole;"), "{c}");
        assert!(
            c.contains("neighbor 198.51.100.1 port 179 as 64500;"),
            "{c}"
        );
        assert!(c.contains("protocol bfd"), "{c}");
        assert!(c.contains("password \"pw\";"), "{c}");
        assert!(c.contains("bgp_community.add((64512, 7));"), "{c}");
        assert!(c.contains("graceful restart off;"), "{c}");
        // iBGP (same ASN) sets its own next hop; hold time 0 has no keepalive.
        let peer1 = &c[c.find("protocol bgp peer1").unwrap()..];
        assert!(
            peer1.contains("next hop self;") && peer1.contains("ipv6 {"),
            "{peer1}"
        );
        assert!(!peer1.contains("keepalive"), "{peer1}");
        assert!(!c.contains("protocol kernel"), "{c}");
    }

    /// Every VIP of `vips` with a standard and a large community and a local preference.
    fn attrs(vips: &[IpAddr]) -> BTreeMap<IpAddr, RouteAttrs> {
        vips.iter()
            .map(|v| {
                let a = RouteAttrs {
                    communities: vec![(64512, 100), (64512, 200)],
                    large_communities: vec![(4_200_000_000, 1, 2)],
                    local_pref: Some(300),
                };
                (*v, a)
            })
            .collect()
    }

    #[test]
    fn route_attributes_go_on_their_vips_route_only() {
        let b = bgp("[[gateway.bgp.peers]]\naddress = \"198.51.100.1\"\nasn = 64500\n");
        let vips: Vec<IpAddr> = vec![
            "203.0.113.10".parse().unwrap(),
            "203.0.113.11".parse().unwrap(),
        ];
        let c = config(&b, &vips, &attrs(&vips[..1]));
        assert!(
            c.contains("  route 203.0.113.10/32 blackhole { bgp_community.add((64512, 100)); bgp_community.add((64512, 200)); bgp_large_community.add((4200000000, 1, 2)); bgp_local_pref = 300; };\n"),
            "{c}"
        );
        assert!(c.contains("  route 203.0.113.11/32 blackhole;\n"), "{c}");
        // Attributes that set nothing write a plain route.
        let mut empty = BTreeMap::new();
        empty.insert(vips[1], RouteAttrs::default());
        let c = config(&b, &vips, &empty);
        assert!(c.contains("  route 203.0.113.11/32 blackhole;\n"), "{c}");
    }

    /// BIRD itself parses what we write (`bird -p`), when it is installed.
    #[test]
    fn bird_accepts_the_configuration() {
        let bird = Path::new(Bgp::DEFAULT_DAEMON);
        let b = bgp("[[gateway.bgp.peers]]\naddress = \"198.51.100.1\"\nasn = 64500\nbfd = true\npassword = \"a b\"\nhold_time = \"3s\"\n[[gateway.bgp.peers]]\naddress = \"2001:db8::1\"\nasn = 64512\nhold_time = \"0s\"\n");
        let vips: Vec<IpAddr> = vec![
            "203.0.113.10".parse().unwrap(),
            "2001:db8:1::5".parse().unwrap(),
        ];
        for announced in [&vips[..], &[]] {
            let text = config(&b, announced, &attrs(&vips));
            if let Some(Err(e)) = strait_testkit::bird::parses(bird, &text) {
                panic!("bird -p refused:\n{e}\n{text}");
            }
        }
    }

    #[test]
    fn show_protocols_lines_parse() {
        let p = parse_protocol("peer0      BGP        ---        start  18:20:01.123  Active        Socket: Connection refused").unwrap();
        assert_eq!((p.name.as_str(), p.state.as_str()), ("peer0", "start"));
        assert_eq!(p.info, "Active Socket: Connection refused");
        let p = parse_protocol("peer1 BGP --- up 2026-12-01 18:20:01 Established").unwrap();
        assert_eq!((p.state.as_str(), p.info.as_str()), ("up", "Established"));
    }
}
