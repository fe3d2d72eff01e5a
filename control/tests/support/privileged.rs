//! The gate of the privileged tests: root plus the tools a test drives.

use std::io::Write;
use std::process::Command;

/// Whether privileged test `test` can run: effective uid 0 and every `(tool, probe flag,
/// Debian package)` answering. Otherwise panics naming what is missing, or, with
/// `STRAIT_SKIP_PRIVILEGED=1`, prints a SKIPPED banner past the harness's capture and
/// returns false. CI never sets the variable.
pub fn privileged(test: &str, tools: &[(&str, &str, &str)]) -> bool {
    let root = std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
    });
    let mut missing = Vec::new();
    if !root {
        missing.push("root (effective uid 0)".to_owned());
    }
    for (tool, probe, package) in tools {
        if !Command::new(tool)
            .arg(probe)
            .output()
            .is_ok_and(|o| o.status.success())
        {
            missing.push(format!("`{tool}` (apt-get install -y {package})"));
        }
    }
    if missing.is_empty() {
        return true;
    }
    let what = missing.join(", ");
    if std::env::var("STRAIT_SKIP_PRIVILEGED").as_deref() == Ok("1") {
        let _ = writeln!(
            std::io::stderr(),
            "\n**** SKIPPED {test}: needs {what} (STRAIT_SKIP_PRIVILEGED=1) ****\n"
        );
        return false;
    }
    panic!(
        "{test} is a privileged test and needs {what}; run the tests as root with those \
         installed (scripts/deps.sh), or set STRAIT_SKIP_PRIVILEGED=1 to skip it"
    );
}
