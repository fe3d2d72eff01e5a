//! Kubernetes objects both Kubernetes test files make the same way.

use serde_json::{json, Value};

/// The `loadBalancerClass` the gateway serves by default.
pub const CLASS: &str = "strait.dev/gateway";

/// A Ready Node `name` with InternalIP `ip`.
pub fn node(name: &str, ip: &str) -> Value {
    json!({
        "kind": "Node", "apiVersion": "v1",
        "metadata": { "name": name },
        "status": {
            "addresses": [
                { "type": "InternalIP", "address": ip },
                { "type": "Hostname", "address": name }
            ],
            "conditions": [{ "type": "Ready", "status": "True" }]
        }
    })
}
