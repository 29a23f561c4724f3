//! Elementwise ops: arithmetic (Add, Sub, Mul, Div), comparisons (EQ, NE, LT,
//! LE, GT, GE), logic (And, Or, Xor, Not), and Sum, WeightedSum, Scale, Cast.
//!
//! Semantics follow Caffe2's CPU kernels. Where Caffe2 had undefined
//! behaviour, this port picks one documented behaviour:
//! - Integer Add/Sub/Mul/Div wrap on overflow (two's complement, which is what
//!   Caffe2's C++ did in practice), so `i64::MIN / -1 == i64::MIN`. Integer
//!   division truncates toward zero. A zero integer divisor is a
//!   `DivisionByZero` error (Caffe2: undefined behaviour).
//! - Float arithmetic and comparisons follow IEEE 754 (x/0 is ±inf or NaN,
//!   and NaN compares unequal to everything).
//! - Cast from float to int truncates toward zero, like numpy's `astype`.
//!   Values outside the target's range saturate and NaN becomes 0 (C++:
//!   undefined). Int to int wraps (keeps the low bits). Numeric to bool is
//!   `x != 0` (so NaN gives true). Bool to numeric gives 0 or 1.
//! - Every check runs before any output is written, so an op that fails
//!   leaves its output (and an in-place input) unchanged.
//!
//! Performance: kernels write into the output's existing buffer when it
//! already holds a tensor of the result dtype and shape. When the output is an
//! input, they update it in place, so a scalar `x = x + 1` allocates nothing.
//! Contiguous operands of 256K elements or more are split across the rayon
//! pool, in tasks of a few 16K-element chunks.
//! A new output buffer of 4 MiB or more asks for huge pages, as numpy's arrays
//! do. A separate output of 16 MiB or more (too big to stay in cache for the
//! next op) is computed block by block into an L1-sized scratch buffer and
//! streamed out with non-temporal stores (x86-64): the output's cache lines
//! are then never read from memory before being overwritten (no
//! write-allocate), so the op moves 3 arrays instead of 4.

//!
//! The files: `loops.rs` (broadcasting and the loops), `arith.rs`,
//! `logic.rs` (comparisons, logic, bitwise), `cast.rs` (dtype
//! conversions), `affine.rs` (ElementwiseLinear); each holds its ops' schemas beside their kernels.

pub mod affine;
pub mod arith;
pub mod cast;
pub mod logic;
mod loops;
#[cfg(test)]
mod tests;

pub(crate) use loops::{legacy_axis, legacy_shapes, numpy_shape, Shape};

pub fn schemas() -> Vec<crate::operator::OpSchema> {
    let mut v = arith::schemas();
    v.extend(arith::grad_schemas());
    v.extend(logic::schemas());
    v.extend(cast::schemas());
    v.extend(affine::schemas());
    v
}
