//! Being written.

/// Placeholder until the bench lands.
pub fn run(_json: bool) -> anyhow::Result<()> {
    anyhow::bail!("not built yet")
}
