//! Gateway configurations as TOML text, built from the parts a test varies.
//!
//! Most tests need a valid configuration that differs from the usual one (an interface
//! `eth0` with queue 0, a service or two) in a field or two: a mode, a table size, a
//! backend's MAC, a health check. [`GatewayToml`] and [`ServiceToml`] write the rest, so a test
//! names only what matters to it. The text goes through the real parser
//! (`strait_config::parse`), as an operator's file does; a configuration that is wrong on
//! purpose (a bad field under test) stays inline in its test, where the reader sees it.
//!
//! Values given to [`GatewayToml::set`], [`ServiceToml::set`] and [`ServiceToml::backend_table`] are
//! TOML as written (`"\"nat\""`, `251`, `{ kind = "tcp" }`); the typed methods quote for
//! the caller.

use std::fmt;

/// A gateway configuration: `[gateway]` keys, its interfaces, extra gateway tables and the
/// services, written by [`fmt::Display`] (`.to_string()`).
#[derive(Clone, Debug, Default)]
pub struct GatewayToml {
    gateway: Vec<(String, String)>,
    tables: Vec<String>,
    interfaces: Vec<Interface>,
    services: Vec<ServiceToml>,
}

impl GatewayToml {
    /// No interface, no service, no `[gateway]` key.
    pub fn new() -> Self {
        Self::default()
    }

    /// The usual gateway: one interface, `eth0`, with queue 0.
    pub fn eth0() -> Self {
        Self::new().interface("eth0", &[0])
    }

    /// Adds `key = value` under `[gateway]`; `value` is TOML (`576`, `"\"127.0.0.1:0\""`).
    pub fn set(mut self, key: &str, value: impl fmt::Display) -> Self {
        self.gateway.push((key.to_string(), value.to_string()));
        self
    }

    /// Adds an interface and the queues its workers serve.
    pub fn interface(mut self, name: &str, queues: &[u32]) -> Self {
        self.interfaces.push(Interface {
            name: name.to_string(),
            queues: queues.to_vec(),
            keys: Vec::new(),
        });
        self
    }

    /// Adds `key = value` to the interface added last (`role`, `vlans`); `value` is TOML.
    ///
    /// # Panics
    /// When no interface was added yet.
    pub fn interface_set(mut self, key: &str, value: impl fmt::Display) -> Self {
        let last = self
            .interfaces
            .last_mut()
            .expect("an interface to set a key of");
        last.keys.push((key.to_string(), value.to_string()));
        self
    }

    /// Adds a table of the gateway's own, whole (`"[gateway.bgp]\nasn = 64512\n..."`).
    pub fn table(mut self, text: &str) -> Self {
        self.tables.push(text.to_string());
        self
    }

    /// Adds a service.
    pub fn service(mut self, s: ServiceToml) -> Self {
        self.services.push(s);
        self
    }
}

impl fmt::Display for GatewayToml {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.gateway.is_empty() {
            writeln!(f, "[gateway]")?;
            for (k, v) in &self.gateway {
                writeln!(f, "{k} = {v}")?;
            }
        }
        for t in &self.tables {
            writeln!(f, "{}", t.trim_end())?;
        }
        for i in &self.interfaces {
            writeln!(
                f,
                "[[gateway.interfaces]]\nname = \"{}\"\nqueues = {:?}",
                i.name, i.queues
            )?;
            for (k, v) in &i.keys {
                writeln!(f, "{k} = {v}")?;
            }
        }
        for s in &self.services {
            write!(f, "{s}")?;
        }
        Ok(())
    }
}

/// One `[[gateway.interfaces]]` entry.
#[derive(Clone, Debug)]
struct Interface {
    name: String,
    queues: Vec<u32>,
    keys: Vec<(String, String)>,
}

/// One `[[services]]` entry: name, VIP and port, the keys a test sets and the backends
/// (`backends = []` when none is added).
#[derive(Clone, Debug)]
pub struct ServiceToml {
    name: String,
    vip: String,
    port: u32,
    keys: Vec<(String, String)>,
    backends: Vec<String>,
}

impl ServiceToml {
    /// A service `name` at `vip`:`port`, the parser's defaults for everything else.
    /// The port is wider than a port so that a test can write a wrong one.
    pub fn new(name: &str, vip: &str, port: u32) -> Self {
        Self {
            name: name.to_string(),
            vip: vip.to_string(),
            port,
            keys: Vec::new(),
            backends: Vec::new(),
        }
    }

    /// Adds `key = value`; `value` is TOML (`251`, `"{ kind = \"tcp\" }"`).
    pub fn set(mut self, key: &str, value: impl fmt::Display) -> Self {
        self.keys.push((key.to_string(), value.to_string()));
        self
    }

    /// Sets the forwarding mode (`"nat"`, `"dsr-l2"`, ...).
    pub fn mode(self, mode: &str) -> Self {
        self.set("mode", format!("\"{mode}\""))
    }

    /// Sets the protocol (`"tcp"`, `"udp"`, `"sctp"`).
    pub fn protocol(self, protocol: &str) -> Self {
        self.set("protocol", format!("\"{protocol}\""))
    }

    /// Sets the Maglev table size (a small prime keeps a test fast).
    pub fn maglev_table_size(self, size: u32) -> Self {
        self.set("maglev_table_size", size)
    }

    /// Adds a backend at `address`:`port`, its MAC left to neighbour discovery.
    pub fn backend(self, address: &str, port: u16) -> Self {
        self.backend_table(format!("{{ address = \"{address}\", port = {port} }}"))
    }

    /// Adds a backend at `address`:`port` with a configured MAC (`"02:00:00:00:01:11"`).
    pub fn backend_mac(self, address: &str, port: u16, mac: &str) -> Self {
        self.backend_table(format!(
            "{{ address = \"{address}\", port = {port}, mac = \"{mac}\" }}"
        ))
    }

    /// Adds a backend written as an inline TOML table, for the keys the other two leave out.
    pub fn backend_table(mut self, table: impl fmt::Display) -> Self {
        self.backends.push(table.to_string());
        self
    }
}

impl fmt::Display for ServiceToml {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "[[services]]\nname = \"{}\"\nvip = \"{}\"\nport = {}",
            self.name, self.vip, self.port
        )?;
        for (k, v) in &self.keys {
            writeln!(f, "{k} = {v}")?;
        }
        writeln!(f, "backends = [{}]", self.backends.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_the_parts_in_toml_order_and_the_parser_takes_them() {
        let bgp = "[gateway.bgp]\nasn = 64512\nrouter_id = \"192.0.2.1\"\n\
                   peers = [{ address = \"198.51.100.1\", asn = 64500 }]\n";
        let t = GatewayToml::eth0()
            .interface("eth1", &[0, 1])
            .interface_set("role", "\"backend\"")
            .set("mtu", 1400)
            .table(bgp)
            .service(
                ServiceToml::new("web", "203.0.113.10", 80)
                    .mode("nat")
                    .maglev_table_size(251)
                    .backend("198.51.100.11", 8080)
                    .backend_mac("198.51.100.12", 8080, "02:00:00:00:01:12"),
            )
            .service(ServiceToml::new("api", "2001:db8::10", 443).protocol("udp"));
        assert_eq!(
            t.to_string(),
            format!(
                "[gateway]\nmtu = 1400\n{bgp}\
                 [[gateway.interfaces]]\nname = \"eth0\"\nqueues = [0]\n\
                 [[gateway.interfaces]]\nname = \"eth1\"\nqueues = [0, 1]\nrole = \"backend\"\n\
                 [[services]]\nname = \"web\"\nvip = \"203.0.113.10\"\nport = 80\n\
                 mode = \"nat\"\nmaglev_table_size = 251\n\
                 backends = [{{ address = \"198.51.100.11\", port = 8080 }}, \
                 {{ address = \"198.51.100.12\", port = 8080, mac = \"02:00:00:00:01:12\" }}]\n\
                 [[services]]\nname = \"api\"\nvip = \"2001:db8::10\"\nport = 443\n\
                 protocol = \"udp\"\nbackends = []\n"
            )
        );
        let cfg = strait_config::parse(&t.to_string()).expect("the real parser takes it");
        assert_eq!(cfg.gateway.mtu, 1400);
        assert!(cfg.gateway.bgp.is_some());
        assert_eq!(cfg.gateway.interfaces.len(), 2);
        assert_eq!(cfg.services.len(), 2);
        assert_eq!(cfg.services[0].backends.len(), 2);
    }
}
