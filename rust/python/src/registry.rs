//! The operator registry and the kernel pool, as Python sees them.

use crate::errors::to_py_err;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

/// Every registered operator type, sorted.
#[pyfunction]
pub(crate) fn registered_operators() -> Vec<&'static str> {
    ferrocaffe::operator::registered_ops()
}

/// An operator's schema as a dict (counts, args, the arguments it accepts
/// and ignores, doc, whether it infers its outputs' shapes), or None.
#[pyfunction]
pub(crate) fn operator_schema(py: Python<'_>, op_type: &str) -> PyResult<Option<Py<PyDict>>> {
    let Some(s) = ferrocaffe::operator::schema(op_type) else {
        return Ok(None);
    };
    // usize::MAX (no upper bound) becomes None.
    let bound = |n: usize| (n != usize::MAX).then_some(n);
    let d = PyDict::new(py);
    d.set_item("name", s.name)?;
    d.set_item("min_inputs", s.min_inputs)?;
    d.set_item("max_inputs", bound(s.max_inputs))?;
    d.set_item("min_outputs", s.min_outputs)?;
    d.set_item("max_outputs", bound(s.max_outputs))?;
    d.set_item("doc", s.doc)?;
    d.set_item("infers_shapes", s.infer.is_some())?;
    let args = PyList::empty(py);
    for a in s.args {
        args.append((a.name, a.ty, a.default, a.doc))?;
    }
    d.set_item("args", args)?;
    // Accepted and ignored: the op's own list, then the engine hints.
    let ignored = PyList::empty(py);
    for a in s.ignored.iter().chain(ferrocaffe::operator::ENGINE_HINTS) {
        if !s.args.iter().any(|own| own.name == a.name) {
            ignored.append((a.name, a.ty, a.default, a.doc))?;
        }
    }
    d.set_item("ignored", ignored)?;
    Ok(Some(d.unbind()))
}

/// Whether `op_type`'s input `input` and output `output` may be one blob
/// (in-place), or None for an unregistered type. The backward pass asks
/// before it names a gradient op's output after an input it consumes.
#[pyfunction]
pub(crate) fn operator_allows_inplace(op_type: &str, input: usize, output: usize) -> Option<bool> {
    ferrocaffe::operator::schema(op_type).map(|s| s.may_share(input, output))
}

/// Fixes the size of the kernel (rayon) pool; see `ferrocaffe::threads`.
#[pyfunction]
pub(crate) fn set_num_threads(py: Python<'_>, n: usize) -> PyResult<bool> {
    ferrocaffe::threads::set_num_threads(n).map_err(|e| to_py_err(py, e))
}

/// Sets the limit in bytes of the cache of freed large buffers (0 turns
/// it off and gives back what it holds); returns the previous limit. See
/// `ferrocaffe::alloc`.
#[pyfunction]
pub(crate) fn set_buffer_cache_limit(nbytes: usize) -> usize {
    ferrocaffe::alloc::set_limit(nbytes)
}

/// Bytes of freed large buffers the cache holds now.
#[pyfunction]
pub(crate) fn buffer_cache_bytes() -> usize {
    ferrocaffe::alloc::cached_bytes()
}

/// Payload bytes that Load ops of this process read with direct I/O (by the
/// disk straight into tensor memory, for checkpoints not in the page cache;
/// `FERROCAFFE_DIRECT_IO=0` turns that off).
#[pyfunction]
pub(crate) fn direct_io_bytes() -> u64 {
    ferrocaffe::storage::direct_bytes_read()
}

/// Threads in the kernel (rayon) pool.
#[pyfunction]
pub(crate) fn num_threads() -> usize {
    ferrocaffe::threads::num_threads()
}

/// What a blob is known to be for shape inference: `(dims, TensorProto
/// data type)`, or None (unknown).
pub(crate) type PyShape = Option<(Vec<i64>, i32)>;

pub(crate) fn shape_to_py(s: &Option<ferrocaffe::operator::ShapeInfo>) -> PyShape {
    s.as_ref().map(|s| (s.dims.clone(), s.dtype as i32))
}

/// Shape and type inference (`ferrocaffe::shapes`): what is known of every
/// blob after the nets' ops, starting from `known`.
#[pyfunction]
pub(crate) fn infer_shapes(
    py: Python<'_>,
    nets: Vec<Vec<u8>>,
    known: std::collections::HashMap<String, PyShape>,
) -> PyResult<std::collections::HashMap<String, PyShape>> {
    use ferrocaffe::operator::ShapeInfo;
    use ferrocaffe::tensor::DataType;
    let defs = nets
        .iter()
        .map(|b| crate::convert::decode::<ferrocaffe::ir::NetDef>(py, b, "NetDef"))
        .collect::<PyResult<Vec<_>>>()?;
    let mut map: ferrocaffe::shapes::ShapeMap = known
        .into_iter()
        .map(|(name, s)| {
            let info = s.map(|(dims, code)| {
                ShapeInfo::new(
                    dims,
                    DataType::from_i32(code).unwrap_or(DataType::Undefined),
                )
            });
            (name, info)
        })
        .collect();
    ferrocaffe::shapes::infer_nets(&defs, &mut map);
    Ok(map
        .iter()
        .map(|(k, v)| (k.clone(), shape_to_py(v)))
        .collect())
}
