//! Errors of loading a configuration.
//!
//! A configuration is either read and fully valid, or refused with the whole list of what
//! is wrong with it: one [`Problem`] per finding, each naming the field by its TOML path.
//! Stopping at the first finding would make fixing a file a loop of edit and retry.

use std::fmt;
use std::path::PathBuf;

/// One thing wrong with a configuration, located by its TOML path.
///
/// Displayed as `path: message`, e.g.
/// `services[2].backends[0].port: 70000 is not a port number`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Problem {
    /// Where: dotted keys and `[index]`es, like `services[2].backends[0].port`. Empty when
    /// the problem concerns the whole document (e.g. a syntax error the parser could not
    /// place in a table).
    pub path: String,
    /// What: a sentence fragment naming the offending value and the rule it breaks.
    pub message: String,
}

impl Problem {
    /// A problem at `path`.
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    /// Says what the operating system said itself (it is the reason, not a cause behind
    /// one), so that every way of printing the error shows it.
    #[error("cannot read configuration file {}: {reason}", path.display())]
    Io {
        /// The file that was asked for.
        path: PathBuf,
        /// What the operating system said.
        reason: std::io::Error,
    },
    /// The text is not a valid configuration. Never empty; displayed one problem per line.
    #[error("{}", Lines(.0))]
    Invalid(Vec<Problem>),
}

impl ConfigError {
    /// The problems of an [`ConfigError::Invalid`] configuration; empty for an I/O error.
    pub fn problems(&self) -> &[Problem] {
        match self {
            ConfigError::Io { .. } => &[],
            ConfigError::Invalid(problems) => problems,
        }
    }
}

/// Displays problems one per line.
struct Lines<'a>(&'a [Problem]);

impl fmt::Display for Lines<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problem_display() {
        let p = Problem::new("services[2].backends[0].port", "70000 is not a port number");
        assert_eq!(
            p.to_string(),
            "services[2].backends[0].port: 70000 is not a port number"
        );
        assert_eq!(Problem::new("", "whole file").to_string(), "whole file");
    }

    #[test]
    fn invalid_lists_every_problem_on_its_own_line() {
        let e = ConfigError::Invalid(vec![Problem::new("a", "one"), Problem::new("b[0]", "two")]);
        assert_eq!(e.to_string(), "a: one\nb[0]: two");
        assert_eq!(e.problems().len(), 2);
    }

    #[test]
    fn io_names_the_file_and_the_reason() {
        let e = ConfigError::Io {
            path: "/nonexistent/strait.toml".into(),
            reason: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        assert_eq!(
            e.to_string(),
            "cannot read configuration file /nonexistent/strait.toml: entity not found"
        );
        assert!(e.problems().is_empty());
    }
}
