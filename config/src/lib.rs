//! Strait's typed configuration: TOML in, a validated [`Config`] out.
//!
//! ```text
//! text ──toml──> raw::RawConfig ──validate──> model::Config ──> dataplane tables, control
//!        │ syntax errors,         │ ranges, formats, cross-field rules
//!        │ unknown fields,        │ (ports, primes, families, DSR port rule, uniqueness)
//!        └ type errors ───────────┴──> ConfigError::Invalid(Vec<Problem>)
//! ```
//!
//! "Parse, don't validate": the raw serde types accept anything shaped like the file, the
//! model types can only hold valid values, and the one function between them reports every
//! problem it finds, each with the TOML path of the field (`services[2].backends[0].port:
//! 70000 is not a port number`). Nothing downstream re-checks a [`Config`].
//!
//! [`EXAMPLE`] is the annotated reference file and the built-in default configuration.
//!
//! ```
//! use strait_config::{parse, Mode, Protocol};
//!
//! let config = parse(r#"
//!     [[gateway.interfaces]]
//!     name = "eth0"
//!     queues = [0, 1]
//!
//!     [[services]]
//!     name = "web"
//!     vip = "203.0.113.10"
//!     port = 80
//!
//!     [[services.backends]]
//!     address = "198.51.100.11"
//! "#)?;
//! let web = &config.services[0];
//! assert_eq!(web.mode, Mode::DsrL2); // the gateway's default_mode
//! assert_eq!(web.protocol, Protocol::Tcp);
//! assert_eq!(web.backends[0].port, 80); // DSR: the service port
//!
//! let err = parse(r#"
//!     [[gateway.interfaces]]
//!     name = "eth0"
//!     queues = [0]
//!
//!     [[services]]
//!     name = "web"
//!     vip = "203.0.113.10"
//!     port = 70000
//!     mode = "dsr-foo"
//! "#).unwrap_err();
//! assert_eq!(err.to_string(), "\
//! services[0].port: 70000 is not a port number
//! services[0].mode: \"dsr-foo\" is not one of dsr-l2, dsr-ipip, dsr-gue, nat");
//! # Ok::<(), strait_config::ConfigError>(())
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod error;
pub mod model;
mod raw;
pub mod summary;
mod validate;

use std::path::Path;

pub use error::{ConfigError, Problem};
pub use model::{
    is_prime, Backend, BackendState, Config, DnsType, Gateway, HealthCheck, HealthKind, Interface,
    MacAddr, Mode, ParseEnumError, ParseMacError, PassiveHealth, Protocol, Role, RouteAttrs,
    Service, Timeouts,
};
pub use summary::summary;
pub use validate::{parse_community, parse_large_community, parse_slow_start};

/// The annotated example configuration (`strait.example.toml`), also the built-in default
/// of `strait run` and `strait check`.
pub const EXAMPLE: &str = include_str!("../strait.example.toml");

/// Reads and validates the configuration file at `path`.
///
/// # Errors
///
/// [`ConfigError::Io`] if the file cannot be read, [`ConfigError::Invalid`] with every
/// problem found if it is not a valid configuration.
pub fn load(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|reason| ConfigError::Io {
        path: path.to_owned(),
        reason,
    })?;
    parse(&text)
}

/// Parses and validates configuration text.
///
/// # Errors
///
/// [`ConfigError::Invalid`] with every problem found: TOML syntax errors (or, if the syntax
/// is fine, every unknown field and type error), else every range, format and cross-field
/// rule broken.
pub fn parse(text: &str) -> Result<Config, ConfigError> {
    let raw = raw::parse(text).map_err(ConfigError::Invalid)?;
    validate::validate(&raw).map_err(ConfigError::Invalid)
}

/// Checks one service of a configuration with `gateway` against every rule that concerns
/// a service on its own (the same rules, paths and messages as [`parse`], with the
/// service at `services[index]`), without writing and parsing TOML: what a source that
/// makes services by the thousand (Kubernetes) uses. Returns the service as [`parse`]
/// would give it. Names and frontends unique across services are the caller's to check.
///
/// # Errors
///
/// Every problem found, with paths starting `services[index]`.
pub fn check_service(
    gateway: &Gateway,
    service: &Service,
    index: usize,
) -> Result<Service, Vec<Problem>> {
    validate::validate_service(gateway, &raw::raw_service(service), index)
}

/// The configuration of [`EXAMPLE`].
///
/// # Panics
///
/// Never: the example is checked by this crate's tests.
pub fn example() -> Config {
    parse(EXAMPLE).expect("the built-in example configuration is valid")
}

/// Writes `config` back as TOML, every field spelled out (defaults included), such that
/// `parse(&to_toml(c))` gives `c` again.
///
/// # Panics
///
/// Never: the file types hold only strings, integers, arrays and tables, which always
/// serialize.
pub fn to_toml(config: &Config) -> String {
    toml::to_string(&raw::RawConfig::from(config)).expect("raw configuration serializes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_parses() {
        let config = example();
        assert_eq!(config.services.len(), 2);
        assert_eq!(config.gateway.interfaces[0].name, "veth-gw");
    }

    #[test]
    fn one_service_is_checked_as_parse_checks_it() {
        let config = example();
        for (i, s) in config.services.iter().enumerate() {
            assert_eq!(check_service(&config.gateway, s, i).as_ref(), Ok(s));
        }
        // A bad service: the same problems as a whole configuration holding it.
        let mut bad = config.clone();
        bad.services[1].maglev_table_size = 100;
        bad.services[1].backends[0].port = 1;
        bad.services[1].mode = Mode::DsrL2;
        let want: Vec<String> = parse(&to_toml(&bad))
            .unwrap_err()
            .problems()
            .iter()
            .map(ToString::to_string)
            .collect();
        let got: Vec<String> = check_service(&bad.gateway, &bad.services[1], 1)
            .unwrap_err()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert!(!got.is_empty());
        assert_eq!(got, want);
        // The IPv6 MTU rule, which a whole configuration checks across services.
        let mut small = config.clone();
        small.gateway.mtu = 576;
        small.services[0].vip = "2001:db8::10".parse().unwrap();
        small.services[0].backends.truncate(0);
        let e = check_service(&small.gateway, &small.services[0], 0).unwrap_err();
        assert_eq!(e.len(), 1, "{e:?}");
        assert_eq!(e[0].path, "gateway.mtu");
    }

    #[test]
    fn round_trip() {
        let config = example();
        let text = to_toml(&config);
        assert_eq!(parse(&text).unwrap(), config, "{text}");
    }
}
