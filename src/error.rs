//! The crate's error, by kind. Each stage's error converts into it once. [`Code`] is the one table of
//! status codes: the api maps it to gRPC statuses, streams name it in skipped-sample reports.

use crate::batch::BatchError;
use crate::dataset::DatasetError;
use crate::decode::DecodeError;
use crate::index::IndexError;

#[derive(Clone, Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    PermissionDenied(String),
    #[error("{0}")]
    OutOfRange(String),
    #[error("{0}")]
    Overloaded(String),
    #[error("server is shutting down")]
    ShuttingDown,
    /// The server cannot do the work now (every decode thread stuck).
    #[error("{0}")]
    Unavailable(String),
    /// A read or decode went past its deadline (a stuck file system, a FIFO, a pathological file).
    #[error("{0}")]
    DeadlineExceeded(String),
    #[error("{0}")]
    DataLoss(String),
    /// The request names a state the daemon no longer holds (a replaced sample list).
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    Internal(String),
    /// A video turned out damaged mid-request; the engine re-indexes it and retries once. Seen by a
    /// client only if that retry fails the same way (as DATA_LOSS).
    #[error("{0}")]
    Damaged(String),
}

/// A status code, by the name gRPC gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Code {
    InvalidArgument,
    NotFound,
    PermissionDenied,
    OutOfRange,
    ResourceExhausted,
    Unavailable,
    DeadlineExceeded,
    DataLoss,
    FailedPrecondition,
    Internal,
}

impl Code {
    /// gRPC's name of the code (`DATA_LOSS`), as clients and skipped-sample reports see it.
    pub fn name(self) -> &'static str {
        match self {
            Code::InvalidArgument => "INVALID_ARGUMENT",
            Code::NotFound => "NOT_FOUND",
            Code::PermissionDenied => "PERMISSION_DENIED",
            Code::OutOfRange => "OUT_OF_RANGE",
            Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
            Code::Unavailable => "UNAVAILABLE",
            Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
            Code::DataLoss => "DATA_LOSS",
            Code::FailedPrecondition => "FAILED_PRECONDITION",
            Code::Internal => "INTERNAL",
        }
    }
}

impl Error {
    pub fn code(&self) -> Code {
        match self {
            Error::InvalidArgument(_) => Code::InvalidArgument,
            Error::NotFound(_) => Code::NotFound,
            Error::PermissionDenied(_) => Code::PermissionDenied,
            Error::OutOfRange(_) => Code::OutOfRange,
            Error::Overloaded(_) => Code::ResourceExhausted,
            Error::ShuttingDown | Error::Unavailable(_) => Code::Unavailable,
            Error::DeadlineExceeded(_) => Code::DeadlineExceeded,
            Error::DataLoss(_) | Error::Damaged(_) => Code::DataLoss,
            Error::FailedPrecondition(_) => Code::FailedPrecondition,
            Error::Internal(_) => Code::Internal,
        }
    }
}

/// Runs blocking work (FFmpeg, file walks, assembly) on the blocking pool; a panicked task becomes
/// [`Error::Internal`].
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Internal(format!("blocking task failed: {e}")))?
}

impl From<DatasetError> for Error {
    fn from(e: DatasetError) -> Self {
        let msg = e.to_string();
        match e {
            DatasetError::BadPath { .. } | DatasetError::NotAFile { .. } => {
                Error::InvalidArgument(msg)
            }
            DatasetError::Outside { .. }
            | DatasetError::Absolute { .. }
            | DatasetError::Unreadable { .. } => Error::PermissionDenied(msg),
            DatasetError::NotFound { .. } => Error::NotFound(msg),
            DatasetError::Io { .. } => Error::Internal(msg),
        }
    }
}

impl From<IndexError> for Error {
    fn from(e: IndexError) -> Self {
        let msg = e.to_string();
        match e {
            // FFmpeg could not recognise the file at all: the client sent something that is not media.
            IndexError::Open { .. } | IndexError::NoVideo { .. } | IndexError::TooLarge { .. } => {
                Error::InvalidArgument(msg)
            }
            IndexError::Corrupt { .. } => Error::DataLoss(msg),
        }
    }
}

impl From<DecodeError> for Error {
    fn from(e: DecodeError) -> Self {
        let msg = e.to_string();
        match e {
            DecodeError::Open { .. } | DecodeError::NoVideo { .. } => Error::InvalidArgument(msg),
            DecodeError::Unsupported { .. } => Error::InvalidArgument(msg),
            DecodeError::MissingFrames { .. } => Error::DataLoss(msg),
            DecodeError::Backend { .. } => Error::Internal(msg),
            DecodeError::Damaged { .. } => Error::Damaged(msg),
            DecodeError::Overloaded(_) => Error::Overloaded(msg),
            DecodeError::ShuttingDown => Error::ShuttingDown,
            DecodeError::Deadline { .. } | DecodeError::Cancelled { .. } => {
                Error::DeadlineExceeded(msg)
            }
            DecodeError::Stalled(_) => Error::Unavailable(msg),
        }
    }
}

impl From<BatchError> for Error {
    fn from(e: BatchError) -> Self {
        match e {
            BatchError::Empty | BatchError::OutputTooSmall(..) => Error::Internal(e.to_string()),
            _ => Error::InvalidArgument(e.to_string()),
        }
    }
}

impl From<crate::transport::shm::ShmError> for Error {
    fn from(e: crate::transport::shm::ShmError) -> Self {
        use crate::transport::shm::ShmError as S;
        let msg = e.to_string();
        match e {
            S::UnknownArena(_) => Error::NotFound(msg),
            S::BadSlot { .. } => Error::InvalidArgument(msg),
            S::NotOwner { .. } => Error::PermissionDenied(msg),
            S::Truncated { .. } => Error::DataLoss(msg),
            S::NoSpace { .. } | S::Budget { .. } => Error::Overloaded(msg),
            // The host's shared-memory directory is unusable (removed and not made again, replaced,
            // full of other files): not a bug of the daemon's, and inline replies still work.
            S::Create { .. } => Error::Unavailable(format!(
                "{msg}; replies sent inline (transport inline) are still served"
            )),
            S::TooLarge { .. } => Error::Internal(msg),
        }
    }
}

impl From<crate::gulp::reader::GulpError> for Error {
    fn from(e: crate::gulp::reader::GulpError) -> Self {
        use crate::gulp::reader::GulpError;
        let msg = e.to_string();
        match e {
            GulpError::NotFound { .. } => Error::NotFound(msg),
            GulpError::Corrupt { .. } => Error::DataLoss(msg),
            GulpError::Io { .. } => Error::Internal(msg),
            GulpError::TooLarge { .. } => Error::InvalidArgument(msg),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An unusable shared-memory directory (replaced under the daemon by something not its own) is the
    /// host's fault, not a bug: UNAVAILABLE naming the inline way (it was INTERNAL, logged as a bug on
    /// every request).
    #[test]
    fn an_unusable_shm_directory_is_unavailable_not_a_bug() {
        let e = Error::from(crate::transport::shm::ShmError::Create {
            path: "/dev/shm/vserve-1-ab".into(),
            reason: "the path holds something other than this daemon's own directory".into(),
        });
        assert!(
            matches!(&e, Error::Unavailable(m) if m.contains("/dev/shm/vserve-1-ab") && m.contains("inline")),
            "{e:?}"
        );
    }
}
