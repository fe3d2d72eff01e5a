use super::*;
use crate::core::tests::config;

#[test]
fn reload_swaps_good_configs_and_refuses_bad_ones() {
    let dir = std::env::temp_dir().join(format!("strait-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("strait.toml");
    std::fs::write(&path, config(&["198.51.100.11"])).unwrap();
    let mut c = Driver::start(ConfigSource::File(path.clone())).unwrap();
    assert_eq!(c.shared.table.load().generation, 1);
    let first_id = c.shared.table.load().services[0].backends[0];

    std::fs::write(&path, config(&["198.51.100.11", "198.51.100.12"])).unwrap();
    let m = c.reload().unwrap();
    assert!(m.contains("generation 2"), "{m}");
    let t = c.shared.table.load();
    assert_eq!(t.services[0].backends.len(), 2);
    assert_eq!(
        t.services[0].backends[0], first_id,
        "a kept backend keeps its id"
    );

    std::fs::write(&path, "[gateway]\nmtu = 1\n").unwrap();
    let e = c.reload().unwrap_err().to_string();
    assert!(e.contains("gateway.mtu"), "{e}");
    assert_eq!(
        c.shared.table.load().generation,
        2,
        "a refused reload keeps the table"
    );
    assert_eq!(c.core().config().services[0].backends.len(), 2);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_missing_interface_is_named() {
    let dir = std::env::temp_dir().join(format!("strait-run-if-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("strait.toml");
    std::fs::write(
        &path,
        config(&["198.51.100.11"]).replace("\"lo\"", "\"nosuch0\""),
    )
    .unwrap();
    let e = Driver::start(ConfigSource::File(path))
        .unwrap_err()
        .to_string();
    assert!(e.contains("interface nosuch0 not found"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
