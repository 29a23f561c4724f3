//! The built-in operators, by concept: the file (or folder) of an op is
//! named by what it is (`unary.rs`: every elementwise unary function;
//! `loss.rs`, `fill.rs`, `matmul.rs`, `optim/` by rule family, `conv/`,
//! `elementwise/`, ...; `docs/architecture.md` has the table). Each holds
//! its ops' schemas beside their kernels and exposes `schemas()`, the
//! single source of their validation and docs, and, if it saves objects,
//! `codecs()`; [`builtin_schemas`] and [`builtin_codecs`] list the
//! families (`crate::builtins`, the composition root, hands them to the
//! registries). What families share comes from `kit.rs`, never from
//! another family; `gemm.rs` is the matrix-product kernel they call. This
//! file only lists them.

use crate::operator::OpSchema;

pub mod activation;
pub mod collect;
pub mod control;
pub mod conv;
pub mod counter;
pub mod dataset;
pub mod db;
pub mod detection;
pub mod elementwise;
pub mod fill;
pub(crate) mod gemm;
pub mod index;
pub mod int8;
pub(crate) mod kit;
pub mod loss;
pub mod matmul;
pub mod norm;
pub mod optim;
pub mod pack;
pub mod persistence;
pub mod pool;
pub mod queue;
pub mod rebatching;
pub mod records;
pub mod recurrent;
pub mod reduce;
pub mod resize;
pub mod segment;
pub mod select;
pub mod shape;
pub mod sparse;
pub mod textfile;
pub mod unary;
pub mod utility;

pub fn builtin_schemas() -> Vec<OpSchema> {
    let mut v = Vec::new();
    v.extend(activation::schemas());
    v.extend(collect::schemas());
    v.extend(control::schemas());
    v.extend(conv::schemas());
    v.extend(counter::schemas());
    v.extend(dataset::schemas());
    v.extend(db::schemas());
    v.extend(detection::schemas());
    v.extend(elementwise::schemas());
    v.extend(fill::schemas());
    v.extend(index::schemas());
    v.extend(int8::schemas());
    v.extend(loss::schemas());
    v.extend(matmul::schemas());
    v.extend(norm::schemas());
    v.extend(optim::schemas());
    v.extend(pack::schemas());
    v.extend(persistence::schemas());
    v.extend(pool::schemas());
    v.extend(queue::schemas());
    v.extend(rebatching::schemas());
    v.extend(textfile::schemas());
    v.extend(records::schemas());
    v.extend(recurrent::schemas());
    v.extend(reduce::schemas());
    v.extend(resize::schemas());
    v.extend(segment::schemas());
    v.extend(select::schemas());
    v.extend(shape::schemas());
    v.extend(sparse::schemas());
    v.extend(unary::schemas());
    v.extend(utility::schemas());
    v
}

/// The blob codecs of the families' saved objects (cursors, readers).
pub fn builtin_codecs() -> Vec<(&'static str, crate::storage::BlobDecoder)> {
    let mut v = Vec::new();
    v.extend(dataset::codecs());
    v.extend(db::codecs());
    v.extend(index::codecs());
    v.extend(int8::codecs());
    v
}

pub use kit::{kernel, FnOp};
