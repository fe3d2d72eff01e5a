//! Every bench of the lab, one module each; `strait-lab bench NAME` runs one.

pub mod admin_load;
pub mod churn;
pub mod control;
pub mod failover;
pub mod flood;
pub mod line;
pub mod maglev;
pub mod pipeline;
pub mod rules;
pub mod soak;

use anyhow::Context as _;

/// Starts thread `name` that enters network namespace `ns` (`/run/netns/NS`, opened before the
/// thread starts, so a missing namespace is this call's error) and runs `f` there; threads
/// that `f` starts are born in `ns` too. A failed `setns` (not root) is printed and `f` is not
/// run.
///
/// # Errors
/// The namespace cannot be opened; the thread cannot be spawned.
pub(crate) fn spawn_in_netns(
    ns: &str,
    name: &str,
    f: impl FnOnce() + Send + 'static,
) -> anyhow::Result<std::thread::JoinHandle<()>> {
    let file = enter_file(ns)?;
    let ns = ns.to_owned();
    Ok(std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            if let Err(e) = nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET) {
                eprintln!("bench: entering network namespace {ns}: {e}");
                return;
            }
            f();
        })?)
}

/// Runs `f` on a scoped thread that entered network namespace `ns` and returns its result
/// (threads it starts are born there too).
///
/// # Errors
/// The namespace cannot be opened or entered; the thread panicked.
pub(crate) fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> anyhow::Result<T> {
    let file = enter_file(ns)?;
    std::thread::scope(|s| {
        s.spawn(|| {
            nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET)
                .with_context(|| format!("entering network namespace {ns}"))?;
            Ok(f())
        })
        .join()
        .map_err(|_| anyhow::anyhow!("a thread in {ns} panicked"))?
    })
}

/// Network namespace `ns`'s file, for `setns`.
fn enter_file(ns: &str) -> anyhow::Result<std::fs::File> {
    let path = format!("/run/netns/{ns}");
    std::fs::File::open(&path).with_context(|| path.clone())
}
