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

/// Collects validation problems for one file. A problem found after the parse names its key
/// path only: the file's text places it ([`Problems::placed`]), the same way as a value that did
/// not parse, so no rule has to carry positions around.
pub(crate) struct Problems {
    file: String,
    list: Vec<Found>,
}

/// A problem as a rule found it.
struct Found {
    /// `None` until placed.
    at: Option<(u64, u64)>,
    field: String,
    message: String,
}

impl Problems {
    pub(crate) fn new(file: &str) -> Self {
        Self { file: file.to_owned(), list: Vec::new() }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// A problem of the key `field` (a key path such as `listeners[0].routes[2].sni`).
    pub(crate) fn push(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.list.push(Found { at: None, field: field.into(), message: message.into() });
    }

    /// A problem at a position known without the file's text (a value kept with its position,
    /// checked against other files after the parse).
    pub(crate) fn push_at(&mut self, at: (u64, u64), field: impl Into<String>, message: impl Into<String>) {
        self.list.push(Found { at: Some(at), field: field.into(), message: message.into() });
    }

    /// The problems, each unplaced one placed by `place` (its position, and a note to add to its
    /// message).
    pub(crate) fn placed(self, mut place: impl FnMut(&str) -> ((u64, u64), String)) -> Vec<Problem> {
        let file = self.file;
        self.list
            .into_iter()
            .map(|Found { at, field, message }| {
                let ((line, column), message) = match at {
                    Some(at) => (at, message),
                    None => {
                        let (at, note) = place(&field);
                        (at, message + &note)
                    }
                };
                Problem { file: file.clone(), line, column, field, message }
            })
            .collect()
    }

    /// The problems of a check made without the file's text: every one pushed with its position.
    pub(crate) fn finish<T>(self, value: T) -> Result<T, ConfigError> {
        if self.list.is_empty() {
            return Ok(value);
        }
        Err(ConfigError { problems: self.placed(|_| ((0, 0), String::new())) })
    }
}
