//! What Python's protobuf layer needs from the runtime: the compiled schema
//! (exported as `_core.CAFFE2_FILE_DESCRIPTOR_SET` in `lib.rs`) and the
//! encoder of `core.Net`'s queued ops.

use ferrocaffe::ir;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};

/// `core.Net`'s pending ops, serialised as the `op` fields of a NetDef (to
/// be merged into its NetDef). Each item is a serialised OperatorDef
/// (bytes) or a tuple `(type, inputs, outputs, args)`: two lists of str
/// and a list of serialised Arguments, for an op whose name is "" and whose
/// other fields are unset (see `ir::append_net_op`).
#[pyfunction]
pub fn encode_net_ops<'py>(
    py: Python<'py>,
    ops: &Bound<'py, PyList>,
) -> PyResult<Bound<'py, PyBytes>> {
    fn all<'py, T: pyo3::type_object::PyTypeCheck>(
        list: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Bound<'py, T>>> {
        list.cast::<PyList>()?
            .iter()
            .map(|item| item.cast_into::<T>().map_err(PyErr::from))
            .collect()
    }
    let mut out = Vec::with_capacity(ops.len() * 48);
    let mut scratch = Vec::new();
    for item in ops.iter() {
        if let Ok(op) = item.cast::<PyBytes>() {
            ir::append_net_op_bytes(&mut out, op.as_bytes());
            continue;
        }
        let t = item.cast::<PyTuple>()?;
        let (op_type, inputs, outputs, args) = (
            t.get_item(0)?,
            t.get_item(1)?,
            t.get_item(2)?,
            t.get_item(3)?,
        );
        let (inputs, outputs) = (all::<PyString>(&inputs)?, all::<PyString>(&outputs)?);
        let args = all::<PyBytes>(&args)?;
        let ins: Vec<&str> = inputs.iter().map(|s| s.to_str()).collect::<PyResult<_>>()?;
        let outs: Vec<&str> = outputs
            .iter()
            .map(|s| s.to_str())
            .collect::<PyResult<_>>()?;
        let arg_bytes: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        ir::append_net_op(
            &mut out,
            &mut scratch,
            &ir::OpFields {
                op_type: op_type.cast::<PyString>()?.to_str()?,
                name: "",
                inputs: &ins,
                outputs: &outs,
                args: &arg_bytes,
            },
        );
    }
    Ok(PyBytes::new(py, &out))
}
