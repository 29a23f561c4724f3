//! One error type for the whole runtime.
//!
//! Every failure carries a [`ErrorKind`] (which decides the Python exception
//! class in the bindings) and an [`ErrorContext`] naming the op, net, step and
//! blob involved. Context is filled in as the error travels outwards: the op
//! kernel knows the blob, the net adds the op, the executor adds the step.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// Declares [`ErrorKind`] and its name table from one list, so a kind added
/// here is named everywhere (Python's `errors._BY_KIND` is checked against
/// [`ErrorKind::ALL`] by a test below).
macro_rules! error_kinds {
    ($($(#[$doc:meta])* $kind:ident,)*) => {
        /// What went wrong, coarsely. Each kind maps to one Python exception class.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum ErrorKind {
            $($(#[$doc])* $kind,)*
        }

        impl ErrorKind {
            /// Every kind, in declaration order.
            pub const ALL: &'static [ErrorKind] = &[$(ErrorKind::$kind),*];

            /// The kind's name: the key of its class in `ferrocaffe.errors._BY_KIND`.
            pub fn name(self) -> &'static str {
                match self {
                    $(ErrorKind::$kind => stringify!($kind),)*
                }
            }
        }
    };
}

error_kinds! {
    /// A blob name that is not visible in the workspace (Python: KeyError).
    BlobNotFound,
    /// A net name that is not defined (Python: KeyError).
    NetNotFound,
    /// Wrong blob kind or tensor dtype (Python: TypeError).
    Type,
    /// Tensor shapes that do not fit together (Python: ValueError).
    Shape,
    /// A bad operator argument or input/output count (Python: ValueError).
    InvalidArgument,
    /// An operator type that is not registered (Python: ValueError).
    UnknownOperator,
    /// A malformed net, step or plan (Python: ValueError).
    InvalidPlan,
    /// An index out of range (Python: IndexError).
    IndexOutOfRange,
    /// Integer division by zero (Python: ZeroDivisionError).
    DivisionByZero,
    /// An operator that failed while running (Python: RuntimeError).
    OperatorFailed,
    /// The run was cancelled (Ctrl-C or a sibling's failure).
    Cancelled,
    /// A file system error (Python: OSError).
    Io,
    /// A checkpoint or db that failed verification (Python: ValueError).
    CorruptCheckpoint,
    /// A buffer the system could not allocate (Python: MemoryError).
    OutOfMemory,
    /// A bug in ferrocaffe itself: a caught panic (Python: RuntimeError).
    Internal,
}

/// Where an error happened. Every field is optional; the outermost layer that
/// knows a field fills it in, inner layers never overwrite.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ErrorContext {
    pub op_type: Option<String>,
    pub op_index: Option<usize>,
    pub net: Option<String>,
    pub step: Option<String>,
    pub blob: Option<String>,
    pub file: Option<String>,
}

/// The runtime's error.
/// What went wrong, with its context. Boxed inside [`Error`].
#[derive(Clone)]
pub struct ErrorInner {
    pub kind: ErrorKind,
    pub message: String,
    pub context: ErrorContext,
    /// An opaque foreign error (a Python exception raised inside a Python op)
    /// carried through the runtime untouched, so the caller sees it as raised.
    pub payload: Option<Arc<dyn Any + Send + Sync>>,
    /// An `Io` error whose file does not exist (Python: `MissingFileError`,
    /// also a `FileNotFoundError`).
    pub missing_file: bool,
}

/// A ferrocaffe error: one pointer, so a kernel's `Result<bool>` or
/// `Result<&Tensor>` is returned in registers on the success path (the
/// unboxed struct made every op's return a ~200-byte copy; W1 paid ~30 of
/// its ~530 instructions per op for it). Fields read through `Deref`.
#[derive(Clone)]
pub struct Error(Box<ErrorInner>);

impl std::ops::Deref for Error {
    type Target = ErrorInner;
    #[inline]
    fn deref(&self) -> &ErrorInner {
        &self.0
    }
}

impl std::ops::DerefMut for Error {
    #[inline]
    fn deref_mut(&mut self) -> &mut ErrorInner {
        &mut self.0
    }
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    #[cold]
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error(Box::new(ErrorInner {
            kind,
            message: message.into(),
            context: ErrorContext::default(),
            payload: None,
            missing_file: false,
        }))
    }
    /// The message alone, for callers that re-wrap it.
    pub fn into_message(self) -> String {
        self.0.message
    }
    pub fn blob_not_found(name: &str) -> Self {
        Error::new(
            ErrorKind::BlobNotFound,
            format!("blob '{name}' does not exist"),
        )
        .with_blob(name)
    }
    pub fn type_error(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Type, message)
    }
    pub fn shape(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Shape, message)
    }
    pub fn invalid_arg(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidArgument, message)
    }
    pub fn invalid_plan(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidPlan, message)
    }
    pub fn failed(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::OperatorFailed, message)
    }
    pub fn cancelled() -> Self {
        Error::new(ErrorKind::Cancelled, "the run was cancelled")
    }
    pub fn io(err: &std::io::Error, path: &str) -> Self {
        let mut e = Error::new(ErrorKind::Io, format!("{path}: {err}"));
        e.context.file = Some(path.to_string());
        e.missing_file = err.kind() == std::io::ErrorKind::NotFound;
        e
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Internal, message)
    }

    pub fn with_blob(mut self, blob: &str) -> Self {
        if self.context.blob.is_none() {
            self.context.blob = Some(blob.to_string());
        }
        self
    }
    pub fn with_op(mut self, op_type: &str, index: Option<usize>) -> Self {
        match &self.context.op_type {
            None => {
                self.context.op_type = Some(op_type.to_string());
                self.context.op_index = index;
            }
            // The op named itself without knowing its position: the net adds it.
            Some(t) if t == op_type && self.context.op_index.is_none() => {
                self.context.op_index = index
            }
            Some(_) => {}
        }
        self
    }
    pub fn with_net(mut self, net: &str) -> Self {
        if self.context.net.is_none() {
            self.context.net = Some(net.to_string());
        }
        self
    }
    pub fn with_step(mut self, step: &str) -> Self {
        if self.context.step.is_none() {
            self.context.step = Some(step.to_string());
        }
        self
    }
    pub fn with_file(mut self, file: &str) -> Self {
        if self.context.file.is_none() {
            self.context.file = Some(file.to_string());
        }
        self
    }
    pub fn is_cancelled(&self) -> bool {
        self.kind == ErrorKind::Cancelled
    }

    /// The message with its context appended, as shown to users.
    pub fn full_message(&self) -> String {
        let c = &self.context;
        let mut parts = Vec::new();
        // A name the message already quotes is not repeated in the suffix.
        let quoted = |name: &str| self.message.contains(&format!("'{name}'"));
        if let Some(op) = &c.op_type {
            match c.op_index {
                Some(i) => parts.push(format!("op #{i} '{op}'")),
                None => parts.push(format!("op '{op}'")),
            }
        }
        if let Some(n) = c.net.as_ref().filter(|n| !quoted(n)) {
            parts.push(format!("net '{n}'"));
        }
        if let Some(s) = &c.step {
            parts.push(format!("step '{s}'"));
        }
        if let Some(b) = c.blob.as_ref().filter(|b| !quoted(b)) {
            parts.push(format!("blob '{b}'"));
        }
        if let Some(f) = c.file.as_ref().filter(|f| !quoted(f)) {
            parts.push(format!("file '{f}'"));
        }
        if parts.is_empty() {
            self.message.clone()
        } else {
            format!("{} [{}]", self.message, parts.join(", "))
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.full_message())
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Error({:?}: {})", self.kind, self.full_message())
    }
}

impl std::error::Error for Error {}

/// Shorthand for `Err(Error::new(kind, format!(...)))`.
#[macro_export]
macro_rules! bail {
    ($kind:ident, $($fmt:tt)+) => {
        return Err($crate::error::Error::new($crate::error::ErrorKind::$kind, format!($($fmt)+)))
    };
}

/// Turns a caught panic into an `Internal` error, so a bug in one op never
/// takes the process (or the Python interpreter) down.
pub fn from_panic(payload: Box<dyn Any + Send>) -> Error {
    let msg = if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    };
    Error::internal(format!("internal error (a panic was caught): {msg}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_is_filled_outermost_last_and_never_overwritten() {
        let e = Error::blob_not_found("x")
            .with_op("Add", Some(2))
            .with_net("n")
            .with_op("Sub", None);
        assert_eq!(e.context.op_type.as_deref(), Some("Add"));
        assert_eq!(
            e.full_message(),
            "blob 'x' does not exist [op #2 'Add', net 'n']"
        );
        let e = Error::failed("boom").with_blob("x");
        assert_eq!(e.full_message(), "boom [blob 'x']");
    }

    /// Python's exception table (`python/ferrocaffe/errors.py`, `_BY_KIND`)
    /// has exactly one entry per kind: a kind added in Rust without a class
    /// (or a class for a kind that is gone) fails here, not at run time.
    #[test]
    fn python_exception_table_names_every_kind_once() {
        let src = include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../python/ferrocaffe/errors.py"
        ));
        let table = src
            .split("_BY_KIND = {")
            .nth(1)
            .and_then(|rest| rest.split('}').next())
            .expect("errors.py defines _BY_KIND = {...}");
        let mut keys: Vec<&str> = table
            .lines()
            .filter_map(|l| l.trim().strip_prefix('"')?.split('"').next())
            .collect();
        let mut names: Vec<&str> = ErrorKind::ALL.iter().map(|k| k.name()).collect();
        // Not a kind: the bindings pick it for an `Io` error whose file is
        // missing (`ErrorInner::missing_file`).
        names.push("MissingFile");
        assert_eq!(keys.len(), names.len(), "one entry per kind: {keys:?}");
        keys.sort_unstable();
        names.sort_unstable();
        assert_eq!(keys, names);
    }
}
