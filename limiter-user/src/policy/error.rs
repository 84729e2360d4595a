//! Why a policy was refused, and where.

/// Why a policy was refused: the path of the offending field, the problem,
/// and where in which file when it came from one.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{}{field}: {problem}", location.as_ref().map(|(f, l)| format!("{f}:{l}: ")).unwrap_or_default())]
pub struct PolicyError {
    /// Dotted path, e.g. `class[2].rate`.
    pub field: String,
    pub problem: String,
    /// File and 1-based line.
    pub location: Option<(String, usize)>,
}

pub(crate) fn bad(field: impl Into<String>, problem: impl Into<String>) -> PolicyError {
    PolicyError { field: field.into(), problem: problem.into(), location: None }
}
