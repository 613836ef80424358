//! The library's single error type.
//!
//! Every error that comes from user input names *where* the problem is: the file, the line
//! (1-based, as an editor shows it) and the field or column, so a researcher can fix the input
//! without reading our code.

use std::path::{Path, PathBuf};

/// Errors returned by every fallible function of the library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A problem with a whole file (unreadable, wrong format, wrong shape, …).
    #[error("{path}: {msg}")]
    File {
        /// The offending file.
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },
    /// A problem on one line of a text file (CSV labels, dataset lists, …).
    #[error("{path}:{line}: {msg}")]
    Line {
        /// The offending file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong on that line.
        msg: String,
    },
    /// Labels that do not form a valid hierarchy (ragged rows, inconsistent parents, empty).
    #[error("invalid labels: {0}")]
    Labels(String),
    /// An argument or a field with an invalid value; the message names the field.
    #[error("invalid {field}: {msg}")]
    Invalid {
        /// The argument, option or field name.
        field: String,
        /// What is wrong with its value.
        msg: String,
    },
    /// Shapes that do not agree (embeddings vs labels, queries vs references, …).
    #[error("shape mismatch: {0}")]
    Shape(String),
    /// An error raised by candle (tensor ops, safetensors, npy).
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    /// An I/O error with the path it happened on. The OS error is part of the message and not
    /// also a `source()`, so that error chains (`anyhow`'s `{:#}`) print it once.
    #[error("{path}: {error}")]
    Io {
        /// The file or folder being read or written.
        path: PathBuf,
        /// The underlying error.
        error: std::io::Error,
    },
}

/// `Result` with the library's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An [`Error::File`] for `path`.
    pub fn file(path: impl AsRef<Path>, msg: impl Into<String>) -> Self {
        Error::File {
            path: path.as_ref().to_path_buf(),
            msg: msg.into(),
        }
    }

    /// An [`Error::Line`] for `path` at 1-based `line`.
    pub fn line(path: impl AsRef<Path>, line: usize, msg: impl Into<String>) -> Self {
        Error::Line {
            path: path.as_ref().to_path_buf(),
            line,
            msg: msg.into(),
        }
    }

    /// An [`Error::Invalid`] for the argument or field `field`.
    pub fn invalid(field: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Invalid {
            field: field.into(),
            msg: msg.into(),
        }
    }

    /// An [`Error::Io`] for `path`.
    pub fn io(path: impl AsRef<Path>, error: std::io::Error) -> Self {
        Error::Io {
            path: path.as_ref().to_path_buf(),
            error,
        }
    }
}
