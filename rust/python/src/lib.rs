//! The thin PyO3 layer: `ferrocaffe._core`.
//!
//! The only crate that knows Python; the runtime is the pure crate
//! `ferrocaffe` (`rust/core`). Calls into it go through [`runner::run_here`]
//! (or, for plans that may run Python ops on threads of their own,
//! [`runner::run_detached`]): the GIL is released,
//! Ctrl-C is noticed, and errors are converted once into the
//! `ferrocaffe.errors` classes. Values cross the boundary as numpy arrays (one
//! copy each way) or protobuf bytes.
//!
//! One module per area: [`errors`] (conversion to `ferrocaffe.errors`),
//! [`runner`] (where calls run, Ctrl-C, background plans), [`convert`]
//! (numpy arrays, str/bytes, objects, paths), [`workspace`], [`storage`]
//! (dbs), [`registry`] (operator schemas, thread pool), [`python_op`] (the
//! `Python` operator), [`trace`] (the timeline), [`net_ops`] (`core.Net`'s op list); the schema
//! for Python's `caffe2_pb2` is exported below.

// Errors carry their context by value; they are rare and never on a hot path.
#![allow(clippy::result_large_err)]

mod convert;
mod errors;
mod net_ops;
mod python_op;
mod registry;
mod runner;
mod storage;
mod trace;
mod workspace;

use pyo3::prelude::*;

#[pymodule]
#[pyo3(name = "_core")]
fn core_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<workspace::PyWorkspace>()?;
    m.add_class::<runner::PyBackgroundPlan>()?;
    m.add_class::<python_op::PyTensorWrapper>()?;
    m.add_class::<python_op::PyOpContext>()?;
    m.add_class::<net_ops::PyNetOps>()?;
    ferrocaffe::builtins::register();
    python_op::register_python_op();
    python_op::register_builtin_op_types();
    m.add_function(wrap_pyfunction!(python_op::register_op_type, m)?)?;
    m.add_function(wrap_pyfunction!(runner::run_plan_in_background, m)?)?;
    m.add_function(wrap_pyfunction!(registry::registered_operators, m)?)?;
    m.add_function(wrap_pyfunction!(registry::operator_schema, m)?)?;
    m.add_function(wrap_pyfunction!(registry::operator_allows_inplace, m)?)?;
    m.add_function(wrap_pyfunction!(registry::infer_shapes, m)?)?;
    m.add_function(wrap_pyfunction!(storage::list_db, m)?)?;
    m.add_function(wrap_pyfunction!(storage::map_ferro, m)?)?;
    m.add_function(wrap_pyfunction!(storage::verify_db, m)?)?;
    m.add_function(wrap_pyfunction!(storage::db_exists, m)?)?;
    m.add_function(wrap_pyfunction!(storage::db_info, m)?)?;
    m.add_function(wrap_pyfunction!(storage::detect_db_type, m)?)?;
    m.add_function(wrap_pyfunction!(storage::remove_db, m)?)?;
    m.add_function(wrap_pyfunction!(storage::registered_dbs, m)?)?;
    m.add_function(wrap_pyfunction!(storage::read_kv_db, m)?)?;
    m.add_function(wrap_pyfunction!(storage::open_kv_cursor, m)?)?;
    m.add_class::<storage::PyKvCursor>()?;
    m.add_function(wrap_pyfunction!(storage::write_kv_db, m)?)?;
    m.add_function(wrap_pyfunction!(storage::sweep_stale_temporaries, m)?)?;
    m.add_function(wrap_pyfunction!(storage::write_file_atomically, m)?)?;
    m.add_function(wrap_pyfunction!(registry::set_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(registry::num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(registry::set_buffer_cache_limit, m)?)?;
    m.add_function(wrap_pyfunction!(registry::buffer_cache_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(registry::direct_io_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(trace::trace_start, m)?)?;
    m.add_function(wrap_pyfunction!(trace::trace_stop, m)?)?;
    m.add_function(wrap_pyfunction!(trace::trace_on, m)?)?;
    m.add_function(wrap_pyfunction!(trace::trace_now, m)?)?;
    m.add_function(wrap_pyfunction!(trace::trace_json, m)?)?;
    m.add_function(wrap_pyfunction!(trace::trace_record, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // caffe2.proto, compiled: Python makes its caffe2_pb2 classes from it.
    m.add(
        "CAFFE2_FILE_DESCRIPTOR_SET",
        pyo3::types::PyBytes::new(m.py(), ferrocaffe::ir::FILE_DESCRIPTOR_SET),
    )?;
    Ok(())
}
