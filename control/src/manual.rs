//! The manual an installed `strait` carries: man pages (clap_mangen) and shell completions
//! (clap_complete), generated from the live command line, so that they name exactly the
//! subcommands and flags the binary takes.
//!
//! ```text
//!  strait generate-docs DIR
//!    DIR/man/strait.8, DIR/man/strait-SUBCOMMAND.8 ...   section 8: an administrator's tool
//!    DIR/completions/strait.bash, _strait, strait.fish
//! ```
//!
//! `generate-docs` is added to the command line at run time ([`with_generator`]) rather
//! than declared among the subcommands: the pages and completions are generated from the
//! command line without it, so no operator meets it in `--help`, a man page or a tab
//! completion (clap_complete lists hidden subcommands). The package build
//! (`scripts/package.sh`) runs it on the release binary it ships.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Arg, ArgMatches, Command};
use clap_complete::Shell;

/// The subcommand that writes the manual.
const GENERATE: &str = "generate-docs";

/// The man pages' section: system administration commands (`strait run` needs root).
const SECTION: &str = "8";

/// `cmd` with the hidden `generate-docs DIR` subcommand added.
pub fn with_generator(cmd: Command) -> Command {
    cmd.subcommand(
        Command::new(GENERATE)
            .about("Write the man pages and shell completions into DIR")
            .hide(true)
            .arg(
                Arg::new("dir")
                    .value_name("DIR")
                    .required(true)
                    .value_parser(clap::value_parser!(PathBuf)),
            ),
    )
}

/// The directory `generate-docs` was asked to write into, if it was the subcommand given.
pub fn requested(matches: &ArgMatches) -> Option<PathBuf> {
    match matches.subcommand() {
        Some((GENERATE, m)) => m.get_one::<PathBuf>("dir").cloned(),
        _ => None,
    }
}

/// Writes the man pages of `cmd` and of each visible subcommand into `dir/man`, and its
/// bash, zsh and fish completions into `dir/completions`; returns the files written.
///
/// # Errors
/// When a directory or file cannot be written.
pub fn write(cmd: Command, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let man = dir.join("man");
    std::fs::create_dir_all(&man).with_context(|| format!("creating {}", man.display()))?;
    // The `help` subcommand is `--help` again; its pages would say nothing. Built, so that
    // each subcommand knows its page's name (`strait-run`).
    let mut pages = cmd.clone().disable_help_subcommand(true);
    pages.build();
    man_pages(pages, &man, &mut written)?;
    let mut cmd = cmd;
    let completions = dir.join("completions");
    std::fs::create_dir_all(&completions)
        .with_context(|| format!("creating {}", completions.display()))?;
    let name = cmd.get_name().to_owned();
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let path = clap_complete::generate_to(shell, &mut cmd, &name, &completions)
            .with_context(|| format!("writing the {shell} completions"))?;
        written.push(path);
    }
    Ok(written)
}

/// The page of `cmd` (`strait.8`, `strait-run.8`) and, recursively, of its visible
/// subcommands.
fn man_pages(cmd: Command, dir: &Path, written: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        man_pages(sub.clone(), dir, written)?;
    }
    let page = clap_mangen::Man::new(cmd).section(SECTION);
    let path = page
        .generate_to(dir)
        .with_context(|| format!("writing {}", dir.join(page.get_filename()).display()))?;
    written.push(path);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command line of the same shape as `strait`'s: the generator's own subcommand
    /// stays out of every page and completion, each visible subcommand gets a page.
    #[test]
    fn pages_and_completions_of_the_visible_subcommands() {
        let cli = || {
            Command::new("strait")
                .version("1.2.3")
                .about("the gateway")
                .subcommand(
                    Command::new("run")
                        .about("run it")
                        .arg(Arg::new("config").long("config")),
                )
                .subcommand(Command::new("check").about("check a file"))
                .subcommand(Command::new("secret").hide(true))
        };
        let m = with_generator(cli())
            .try_get_matches_from(["strait", "generate-docs", "/x"])
            .unwrap();
        assert_eq!(requested(&m), Some(PathBuf::from("/x")));
        let m = with_generator(cli())
            .try_get_matches_from(["strait", "check"])
            .unwrap();
        assert_eq!(requested(&m), None);
        assert!(!with_generator(cli())
            .render_help()
            .to_string()
            .contains(GENERATE));

        let dir = tempfile::tempdir().unwrap();
        let files = write(cli(), dir.path()).unwrap();
        let mut names: Vec<String> = files
            .iter()
            .map(|p| p.strip_prefix(dir.path()).unwrap().display().to_string())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "completions/_strait",
                "completions/strait.bash",
                "completions/strait.fish",
                "man/strait-check.8",
                "man/strait-run.8",
                "man/strait.8",
            ]
        );
        let page = std::fs::read_to_string(dir.path().join("man/strait.8")).unwrap();
        assert!(page.contains(".TH strait 8"), "{page}");
        assert!(page.contains("strait\\-run(8)"), "{page}");
        assert!(!page.contains("secret"), "{page}");
        let run = std::fs::read_to_string(dir.path().join("man/strait-run.8")).unwrap();
        assert!(run.contains("\\-\\-config"), "{run}");
        let bash = std::fs::read_to_string(dir.path().join("completions/strait.bash")).unwrap();
        assert!(bash.contains("check") && !bash.contains(GENERATE), "{bash}");
    }
}
