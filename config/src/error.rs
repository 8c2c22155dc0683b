//! Config errors: every problem carries the file, line, column and field path it is about.

use std::fmt;

/// One thing wrong with a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub file: String,
    /// 1-based; 0 when the location is unknown (e.g. the file could not be read).
    pub line: u64,
    pub column: u64,
    /// Field path such as `listeners[0].routes[2].sni`; empty when the parser could not tell.
    pub field: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if self.line > 0 {
            write!(f, ":{}:{}", self.line, self.column)?;
        }
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
}

/// A config that could not be loaded, with all the problems found (at least one).
#[derive(Debug, Clone, thiserror::Error)]
pub struct ConfigError {
    pub problems: Vec<Problem>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

impl ConfigError {
    /// A problem with no position in the file (it cannot be read, or the parsing task could not run).
    pub fn internal(file: &str, what: &str) -> Self {
        Self {
            problems: vec![Problem {
                file: file.to_owned(),
                line: 0,
                column: 0,
                field: String::new(),
                message: what.to_owned(),
            }],
        }
    }

    pub(crate) fn io(file: &str, e: std::io::Error) -> Self {
        Self::internal(file, &format!("cannot read: {e}"))
    }
}

/// Collects validation problems for one file.
pub(crate) struct Problems {
    file: String,
    list: Vec<Problem>,
}

impl Problems {
    pub(crate) fn new(file: &str) -> Self {
        Self { file: file.to_owned(), list: Vec::new() }
    }

    pub(crate) fn push(&mut self, at: (u64, u64), field: impl Into<String>, message: impl Into<String>) {
        self.list.push(Problem {
            file: self.file.clone(),
            line: at.0,
            column: at.1,
            field: field.into(),
            message: message.into(),
        });
    }

    pub(crate) fn into_list(self) -> Vec<Problem> {
        self.list
    }

    pub(crate) fn finish<T>(self, value: T) -> Result<T, ConfigError> {
        if self.list.is_empty() { Ok(value) } else { Err(ConfigError { problems: self.list }) }
    }
}
