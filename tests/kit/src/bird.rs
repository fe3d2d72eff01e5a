//! BIRD's own parser as a test's judge of a configuration we write: `bird -p -c FILE` reads
//! the file, checks it and exits without running.

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

/// Whether the BIRD at `bird` accepts `config`: `None` (after a "skipped" line on stderr)
/// where no BIRD is installed there, else `bird -p`'s verdict, with its complaint on refusal.
pub fn parses(bird: &Path, config: &str) -> Option<Result<(), String>> {
    static N: AtomicU32 = AtomicU32::new(0);
    if !bird.exists() {
        eprintln!("skipped: {} not installed", bird.display());
        return None;
    }
    let file = std::env::temp_dir().join(format!(
        "strait-bird-check-{}-{}.conf",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let run = std::fs::write(&file, config).and_then(|()| {
        std::process::Command::new(bird)
            .arg("-p")
            .arg("-c")
            .arg(&file)
            .output()
    });
    let _ = std::fs::remove_file(&file);
    Some(match run {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
        Err(e) => Err(format!("running {}: {e}", bird.display())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The judge refuses what BIRD refuses, so a test built on it can fail.
    #[test]
    fn bird_refuses_a_broken_configuration_and_takes_an_empty_one() {
        let bird = Path::new("/usr/sbin/bird");
        if let Some(verdict) = parses(bird, "protocol bgp {") {
            assert!(verdict.is_err(), "{verdict:?}");
            assert_eq!(
                parses(bird, "router id 192.0.2.1;\nprotocol device {}\n"),
                Some(Ok(()))
            );
        }
        assert_eq!(parses(Path::new("/nonexistent/bird"), ""), None);
    }
}
