//! Why something was left out of the translation: countable kinds (metrics labels) and the
//! warning that names the object.

use std::fmt;

/// Why something was left out. Each kind is a metrics label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WarningKind {
    /// A Service port with a protocol other than TCP, UDP and SCTP (the API server allows
    /// no other; kept for what it might send one day).
    UnsupportedProtocol,
    /// A port, nodePort or slice port that is missing or out of range.
    BadPort,
    /// An address (external IP, endpoint, node) that does not parse or has the wrong
    /// family.
    BadAddress,
    /// An EndpointSlice of addressType FQDN (or unknown).
    UnsupportedSlice,
    /// An EndpointSlice above the API's 1000 endpoints.
    HugeSlice,
    /// An EndpointSlice without ports.
    SliceWithoutPorts,
    /// A `loadBalancerSourceRanges` entry that does not parse, or a frontend left out
    /// because its family has no allowed range.
    BadSourceRange,
    /// A bad annotation or field value that was replaced by the default.
    BadValue,
    /// A frontend (address, port, protocol) already served by another Service.
    FrontendConflict,
    /// More backends than the largest Maglev table holds.
    TooManyBackends,
    /// A Node without an InternalIP.
    NodeWithoutAddress,
    /// A produced service the configuration rules refused.
    Invalid,
    /// An object that does not parse as its kind.
    Malformed,
}

impl WarningKind {
    /// Every kind.
    pub const ALL: [WarningKind; 13] = [
        WarningKind::UnsupportedProtocol,
        WarningKind::BadPort,
        WarningKind::BadAddress,
        WarningKind::UnsupportedSlice,
        WarningKind::HugeSlice,
        WarningKind::SliceWithoutPorts,
        WarningKind::BadSourceRange,
        WarningKind::BadValue,
        WarningKind::FrontendConflict,
        WarningKind::TooManyBackends,
        WarningKind::NodeWithoutAddress,
        WarningKind::Invalid,
        WarningKind::Malformed,
    ];

    /// The reason of the Event a Service gets for it (`kubectl describe svc`).
    pub fn reason(self) -> &'static str {
        match self {
            WarningKind::UnsupportedProtocol => "UnsupportedProtocol",
            WarningKind::BadPort => "BadPort",
            WarningKind::BadAddress => "BadAddress",
            WarningKind::UnsupportedSlice => "UnsupportedSlice",
            WarningKind::HugeSlice => "HugeSlice",
            WarningKind::SliceWithoutPorts => "SliceWithoutPorts",
            WarningKind::BadSourceRange => "BadSourceRange",
            WarningKind::BadValue => "BadValue",
            WarningKind::FrontendConflict => "FrontendConflict",
            WarningKind::TooManyBackends => "TooManyBackends",
            WarningKind::NodeWithoutAddress => "NodeWithoutAddress",
            WarningKind::Invalid => "InvalidService",
            WarningKind::Malformed => "Malformed",
        }
    }

    /// The metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            WarningKind::UnsupportedProtocol => "unsupported_protocol",
            WarningKind::BadPort => "bad_port",
            WarningKind::BadAddress => "bad_address",
            WarningKind::UnsupportedSlice => "unsupported_slice",
            WarningKind::HugeSlice => "huge_slice",
            WarningKind::SliceWithoutPorts => "slice_without_ports",
            WarningKind::BadSourceRange => "bad_source_range",
            WarningKind::BadValue => "bad_value",
            WarningKind::FrontendConflict => "frontend_conflict",
            WarningKind::TooManyBackends => "too_many_backends",
            WarningKind::NodeWithoutAddress => "node_without_address",
            WarningKind::Invalid => "invalid",
            WarningKind::Malformed => "malformed",
        }
    }
}

/// Something left out of the translation, and why.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Warning {
    /// The kind, for counting.
    pub kind: WarningKind,
    /// The object (`service default/web`, `endpointslice default/web-abc`, `node n1`).
    pub object: String,
    /// What was wrong.
    pub message: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.object, self.message)
    }
}
