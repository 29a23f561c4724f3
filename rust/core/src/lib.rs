//! ferrocaffe: Caffe2's execution layer on a safe Rust core.
//!
//! Layers, bottom up: [`tensor`] and [`blob`] (values), [`workspace`] (named
//! blobs and nets), [`operator`] and [`ops`] (schemas and kernels), [`net`]
//! (ordered ops), [`plan`] (the execution-step scheduler). [`ir`] holds the
//! protobuf plan format. This crate knows nothing of Python: the PyO3 face is
//! the separate crate `rust/python` (`ferrocaffe._core`).

// Errors carry their context by value; they are rare and never on a hot path.
#![allow(clippy::result_large_err)]

pub mod alloc;
pub mod args;
pub mod blob;
pub mod builtins;
pub mod cancel;
pub mod error;
pub mod ir;
pub mod net;
pub mod num;
pub mod operator;
pub mod ops;
pub mod plan;
pub mod readers;
pub(crate) mod scratch;
pub mod shapes;
pub mod storage;
pub mod tensor;
#[cfg(test)]
mod test_util;
pub mod threads;
pub mod trace;
pub mod vmath;
pub mod workspace;

/// Tensors and every other allocation go through the system allocator with
/// a cache of freed large blocks in front (`alloc`).
#[global_allocator]
static GLOBAL: alloc::FerroAlloc = alloc::FerroAlloc;

pub use blob::{Blob, BlobValue};
pub use cancel::CancelToken;
pub use error::{Error, ErrorKind, Result};
pub use tensor::{DataType, Tensor};
pub use workspace::Workspace;
