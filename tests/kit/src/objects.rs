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

/// A LoadBalancer Service of our class in `default`, selecting `app: name`, with `ports` as
/// (name, protocol, port) to target port 8080, `annotations`, uid `uid-NAME` and creation
/// time `age` seconds after a fixed instant (planning orders Services by it).
pub fn lb_service(name: &str, age: u32, ports: &[(&str, &str, u16)], annotations: Value) -> Value {
    let ports: Vec<Value> = ports
        .iter()
        .map(|(n, p, port)| json!({ "name": n, "protocol": p, "port": port, "targetPort": 8080 }))
        .collect();
    json!({
        "kind": "Service", "apiVersion": "v1",
        "metadata": {
            "name": name, "namespace": "default", "uid": format!("uid-{name}"),
            "creationTimestamp": format!("2024-01-01T00:00:{age:02}Z"),
            "annotations": annotations
        },
        "spec": {
            "type": "LoadBalancer",
            "loadBalancerClass": CLASS,
            "ipFamilies": ["IPv4"],
            "ipFamilyPolicy": "SingleStack",
            "externalTrafficPolicy": "Cluster",
            "selector": { "app": name },
            "ports": ports
        }
    })
}

/// `v` with `status.loadBalancer.ingress` showing `addrs`.
pub fn with_status(mut v: Value, addrs: &[&str]) -> Value {
    let ing: Vec<Value> = addrs.iter().map(|a| json!({ "ip": a })).collect();
    v["status"] = json!({ "loadBalancer": { "ingress": ing } });
    v
}
