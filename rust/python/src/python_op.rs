//! The `Python` operator: calls a Python function with tensor wrappers.

use crate::convert::{array_to_tensor, tensor_to_py, utf8, value_to_py};
use crate::errors::to_py_err;
use crate::runner::{os_thread, CallerGuard};
use crate::workspace::PyWorkspace;
use ferrocaffe::blob::BlobValue;
use ferrocaffe::error::Error;
use ferrocaffe::tensor::Tensor;
use numpy::ndarray::IxDyn;
use numpy::PyArrayDyn;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};
use std::sync::Arc;

/// The arrays a Python op's function got through `.data` during one call.
///
/// Caffe2 handed out views of the tensors, so writes reached the blobs. A
/// view is not safe here: the op holds no lock while Python runs (the
/// function may feed, or run nets on, the same blobs), so the buffer under a
/// view could be replaced or freed mid-call. Instead `.data` hands out a copy,
/// the same array for every `.data` of one blob during the call, and when the
/// function returns, each array that differs (bit for bit) from what it was
/// made from is written to its blob. Arrays whose blob was replaced since
/// (`feed`, `reshape`) and every array once the call is over become
/// read-only, so a late write raises instead of vanishing.
#[derive(Default)]
struct HandedArrays {
    /// Whether the function is still running (arrays handed out now are
    /// written back when it returns).
    open: bool,
    entries: Vec<Handed>,
}

struct Handed {
    blob: ferrocaffe::blob::Blob,
    name: String,
    array: Py<PyAny>,
    /// The tensor the array was copied from.
    before: Tensor,
}

type CallArrays = Arc<parking_lot::Mutex<HandedArrays>>;

fn set_read_only(py: Python<'_>, array: &Py<PyAny>) -> PyResult<()> {
    array.call_method1(py, "setflags", (false,)).map(|_| ())
}

impl HandedArrays {
    /// Forgets the array of `blob`, which is being replaced, making it
    /// read-only (its writes are superseded by the new content).
    fn supersede(call: &CallArrays, py: Python<'_>, blob: &ferrocaffe::blob::Blob) -> PyResult<()> {
        let gone: Vec<Handed> = {
            let mut g = call.lock();
            let (gone, kept) = std::mem::take(&mut g.entries)
                .into_iter()
                .partition(|h| Arc::ptr_eq(&h.blob, blob));
            g.entries = kept;
            gone
        };
        gone.iter().try_for_each(|h| set_read_only(py, &h.array))
    }

    /// Ends the call: writes back every changed array when the function
    /// succeeded (`write_back`), then makes all of them read-only.
    fn close(call: &CallArrays, py: Python<'_>, write_back: bool) -> PyResult<()> {
        let entries = {
            let mut g = call.lock();
            g.open = false;
            std::mem::take(&mut g.entries)
        };
        let mut result = Ok(());
        for h in &entries {
            if write_back && result.is_ok() {
                result = array_to_tensor(py, h.array.bind(py), &h.name).map(|after| {
                    if !after.same_bits(&h.before) {
                        py.detach(|| h.blob.set(BlobValue::Tensor(after)));
                    }
                });
            }
            set_read_only(py, &h.array)?;
        }
        result
    }
}

/// One blob as seen by a Python op: Caffe2's TensorCPU wrapper.
#[pyclass(name = "TensorWrapper", module = "ferrocaffe._core", frozen)]
pub struct PyTensorWrapper {
    blob: ferrocaffe::blob::Blob,
    name: String,
    call: CallArrays,
}

#[pymethods]
impl PyTensorWrapper {
    /// The tensor as a numpy array. Writes to it reach the blob when the
    /// op's function returns (see `HandedArrays`); after the call, or after
    /// `feed`/`reshape` of this blob, the array is read-only.
    #[getter]
    fn data(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        if let Some(h) = self
            .call
            .lock()
            .entries
            .iter()
            .find(|h| Arc::ptr_eq(&h.blob, &self.blob))
        {
            return Ok(h.array.clone_ref(py));
        }
        let v = py.detach(|| self.blob.get());
        let t = match v {
            BlobValue::Tensor(t) => t,
            BlobValue::Empty => {
                // Nothing to write into: reshape (or feed) first.
                let a = PyArrayDyn::<f32>::zeros(py, IxDyn(&[0]), false)
                    .into_any()
                    .unbind();
                set_read_only(py, &a)?;
                return Ok(a);
            }
            // Byte strings come back as (immutable) bytes, Python objects
            // as themselves, other objects as a description.
            other => return value_to_py(py, &self.name, &other, true),
        };
        let array = tensor_to_py(py, &t, &self.name)?;
        let mut g = self.call.lock();
        if !g.open {
            drop(g);
            set_read_only(py, &array)?;
            return Ok(array);
        }
        // Another thread of the function may have asked while the GIL was
        // released above: one array per blob.
        if let Some(h) = g.entries.iter().find(|h| Arc::ptr_eq(&h.blob, &self.blob)) {
            return Ok(h.array.clone_ref(py));
        }
        g.entries.push(Handed {
            blob: self.blob.clone(),
            name: self.name.clone(),
            array: array.clone_ref(py),
            before: t,
        });
        Ok(array)
    }

    /// The dims, as a tuple (numpy's and Caffe2's form).
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let dims = py.detach(|| match &*self.blob.read() {
            BlobValue::Tensor(t) => t.shape().to_vec(),
            _ => vec![0],
        });
        PyTuple::new(py, dims)
    }

    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// Replaces the blob's content with the array (or str/bytes).
    fn feed(&self, py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<bool> {
        let v = if let Ok(b) = value.cast::<PyBytes>() {
            BlobValue::Bytes(b.as_bytes().to_vec())
        } else {
            let value = py
                .import("ferrocaffe.workspace")?
                .getattr("_to_feedable")?
                .call1((&self.name, value))?;
            if let Ok(s) = value.cast::<PyString>() {
                BlobValue::Bytes(utf8(py, s, &self.name)?)
            } else {
                BlobValue::Tensor(array_to_tensor(py, &value, &self.name)?)
            }
        };
        HandedArrays::supersede(&self.call, py, &self.blob)?;
        py.detach(|| self.blob.set(v));
        Ok(true)
    }

    /// Resizes the tensor (keeping its dtype, float32 if it had none); the
    /// contents become zeros.
    fn reshape(&self, py: Python<'_>, shape: Vec<usize>) -> PyResult<()> {
        HandedArrays::supersede(&self.call, py, &self.blob)?;
        py.detach(|| {
            let mut g = self.blob.write();
            let dtype = match &*g {
                BlobValue::Tensor(t) => t.dtype(),
                _ => ferrocaffe::tensor::DataType::Float,
            };
            Tensor::zeros(dtype, &shape).map(|t| *g = BlobValue::Tensor(t))
        })
        .map_err(|e| to_py_err(py, e))
    }
}

fn wrap_blobs<'py>(
    py: Python<'py>,
    blobs: &[ferrocaffe::blob::Blob],
    names: &[String],
    call: &CallArrays,
) -> PyResult<Bound<'py, PyList>> {
    let l = PyList::empty(py);
    for (b, n) in blobs.iter().zip(names) {
        l.append(Py::new(
            py,
            PyTensorWrapper {
                blob: b.clone(),
                name: n.clone(),
                call: call.clone(),
            },
        )?)?;
    }
    Ok(l)
}

struct PythonOp {
    func: Py<PyAny>,
    pass_workspace: bool,
    /// A named op type implemented in Python (`register_op_type`): the
    /// function gets an [`PyOpContext`] as its third argument.
    with_context: bool,
}

/// What a named op type implemented in Python sees of its run besides its
/// blobs: the workspace, and whether the run was cancelled (a sibling
/// failed, the session cancelled the node, Ctrl-C), so that an op that waits
/// (a collective waiting for its peers) can stop waiting.
#[pyclass(name = "OpContext", module = "ferrocaffe._core", frozen)]
pub struct PyOpContext {
    ws: Arc<ferrocaffe::workspace::Workspace>,
    cancel: ferrocaffe::cancel::CancelToken,
}

#[pymethods]
impl PyOpContext {
    /// Whether the run this op belongs to was cancelled.
    fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// The op's workspace (a `ferrocaffe.workspace.Workspace`).
    #[getter]
    fn workspace(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(py
            .import("ferrocaffe._python_ops")?
            .getattr("_wrap_workspace")?
            .call1((PyWorkspace {
                ws: self.ws.clone(),
            },))?
            .unbind())
    }
}

impl ferrocaffe::operator::Operator for PythonOp {
    fn run(&mut self, cx: &mut ferrocaffe::operator::OpCx<'_>) -> ferrocaffe::Result<bool> {
        Python::attach(|py| {
            let arrays: CallArrays = Arc::new(parking_lot::Mutex::new(HandedArrays {
                open: true,
                entries: Vec::new(),
            }));
            let call = || -> PyResult<()> {
                let ins = wrap_blobs(py, &cx.io.inputs, &cx.io.input_names, &arrays)?;
                let outs = wrap_blobs(py, &cx.io.outputs, &cx.io.output_names, &arrays)?;
                if self.with_context {
                    let ctx = PyOpContext {
                        ws: cx.ws.clone(),
                        cancel: cx.cancel.clone(),
                    };
                    self.func.call1(py, (ins, outs, ctx))?;
                } else if self.pass_workspace {
                    let ws = py
                        .import("ferrocaffe._python_ops")?
                        .getattr("_wrap_workspace")?
                        .call1((PyWorkspace { ws: cx.ws.clone() },))?;
                    self.func.call1(py, (ins, outs, ws))?;
                } else {
                    self.func.call1(py, (ins, outs))?;
                }
                Ok(())
            };
            // Registered (and unregistered) with the GIL held, so an
            // interrupt (`interrupt_python_ops`) reaches the call only while
            // it is in progress; runs it starts are cancelled with this one.
            let registered = ferrocaffe::cancel::ExternalCall::enter(cx.cancel);
            let caller = CallerGuard::set(cx.cancel);
            let ran = call();
            drop(caller);
            if registered.leave() {
                // An interrupt sent after its last chance to fire would
                // fire in whatever Python code this thread runs next.
                // SAFETY: the GIL is held; a NULL exception clears it.
                unsafe {
                    pyo3::ffi::PyThreadState_SetAsyncExc(
                        os_thread() as std::os::raw::c_long,
                        std::ptr::null_mut(),
                    );
                }
            }
            let closed = HandedArrays::close(&arrays, py, ran.is_ok());
            match ran.and(closed) {
                // An interrupted run goes no further than this op.
                Ok(()) => cx.cancel.check().map(|_| true),
                Err(err) => {
                    let msg = format!(
                        "Python op raised {}",
                        err.value(py)
                            .repr()
                            .map(|r| r.to_string())
                            .unwrap_or_default()
                    );
                    let mut e = Error::failed(msg);
                    e.payload = Some(Arc::new(err));
                    Err(e)
                }
            }
        })
    }
}

impl Drop for PythonOp {
    fn drop(&mut self) {
        // Release the function with the GIL held (the op may die on any thread).
        let f = std::mem::replace(&mut self.func, Python::attach(|py| py.None()));
        Python::attach(move |_| drop(f));
    }
}

fn build_python_op(
    ctx: &ferrocaffe::operator::OpDefCtx<'_>,
) -> ferrocaffe::Result<Box<dyn ferrocaffe::operator::Operator>> {
    let token = ctx.args.string_opt("token")?;
    let pickled = ctx.args.bytes_opt("pickled_builder")?;
    let pass_ws = ctx.args.bool("pass_workspace", false)?;
    if token.is_none() && pickled.is_none() {
        return Err(ctx.bad_arg("a Python op needs a 'token' or a 'pickled_builder' argument"));
    }
    Python::attach(|py| {
        let r = (|| -> PyResult<(Py<PyAny>, bool)> {
            let m = py.import("ferrocaffe._python_ops")?;
            let pickled = pickled.as_ref().map(|b| PyBytes::new(py, b));
            let out = m
                .getattr("build")?
                .call1((token.clone(), pickled, pass_ws))?;
            out.extract::<(Py<PyAny>, bool)>()
        })();
        r.map_err(|err| {
            let text = err
                .value(py)
                .str()
                .map(|s| s.to_string())
                .unwrap_or_default();
            let mut e = Error::invalid_arg(format!("cannot build the Python op: {text}"));
            // A builder's own exception reaches the caller as raised; a
            // refusal of ours (an untrusted pickled builder) becomes a
            // runtime error, so that it names the op's net.
            let ours = py
                .import("ferrocaffe.errors")
                .and_then(|m| m.getattr("FerrocaffeError"))
                .is_ok_and(|cls| err.value(py).is_instance(&cls).unwrap_or(false));
            if ours {
                e = Error::invalid_arg(text);
            } else {
                e.payload = Some(Arc::new(err));
            }
            e
        })
    })
    .map(|(func, pass_workspace)| {
        Box::new(PythonOp {
            func,
            pass_workspace,
            with_context: false,
        }) as Box<dyn ferrocaffe::operator::Operator>
    })
}

pub(crate) fn register_python_op() {
    use ferrocaffe::operator::{InPlace, OpSchema, MANY};
    for (name, doc) in [
        ("Python", "Calls a Python function f(inputs, outputs[, workspace]) with tensor wrappers; holds the GIL while it runs."),
        ("PythonGradient", "The gradient of a Python op (made by AddGradientOperators): calls its grad_f with [inputs, outputs, output gradients] and [input gradients]."),
    ] {
    ferrocaffe::operator::register(
        OpSchema::new(name, build_python_op)
            .inputs(0, MANY)
            .outputs(0, MANY)
            .inplace(InPlace::Allow(|_, _| true))
            .args(&[
                ferrocaffe::arg!("token", "string", "", "key of a function registered with Net.Python"),
                ferrocaffe::arg!("pickled_builder", "bytes", "", "pickled (builder, args, kwargs), called once per op instance"),
                ferrocaffe::arg!("pass_workspace", "bool", "false", "also pass the op's workspace to the function"),
            ])
            .ignores(&[
                ferrocaffe::arg!("grad_output_indices", "list of int", "[]", "read by the op's gradient maker (AddGradientOperators)"),
                ferrocaffe::arg!("grad_input_indices", "list of int", "[]", "read by the op's gradient maker (AddGradientOperators)"),
                ferrocaffe::arg!("pickled_grad_builder", "bytes", "", "read by the op's gradient maker (AddGradientOperators)"),
            ])
            .doc(doc),
    );
    }
}

// ------------------------------------------------- named op types in Python --
//
// An op type whose kernel is Python code (the collectives of
// `ferrocaffe.collective`, which run over a transport that is Python):
// its schema (counts, arguments, in-place rule, doc) is registered here like
// any other, so nets are checked at creation as usual; the kernel is made by
// calling `module.function(op_def)` (an `OperatorDef` message) once per op
// instance, and the callable it returns runs as `f(inputs, outputs,
// context)` with the GIL held, exactly as a `Python` op's function does.

/// Op type -> "module:function" that builds its kernels.
static OP_TYPES: std::sync::LazyLock<
    parking_lot::RwLock<std::collections::HashMap<String, String>>,
> = std::sync::LazyLock::new(Default::default);

/// The op types ferrocaffe implements in Python, registered with `_core`:
/// (name, inputs, outputs, in-place rule, arguments, doc).
type BuiltinOpType = (
    &'static str,
    (usize, usize),
    (usize, usize),
    &'static str,
    &'static [ferrocaffe::operator::ArgDoc],
    &'static str,
);

const COLLECTIVE_MODULE: &str = "ferrocaffe.collective:build_op";

const BUILTIN_OP_TYPES: &[BuiltinOpType] = {
    use ferrocaffe::arg;
    use ferrocaffe::operator::MANY;
    &[
        ("CreateCommonWorld", (0, 1), (1, 1), "never", &[
            arg!("size", "int", "", "number of members (Caffe2's num_shards)"),
            arg!("rank", "int", "", "this member's rank, 0 <= rank < size (Caffe2's shard_id)"),
            arg!("timeout_ms", "int", "30000", "how long every collective of this world may wait for its peers"),
            arg!("transport", "string", "\"tcp\"", "Caffe2's gloo transport; only 'tcp' (meaning: Ray) is accepted"),
            arg!("interface", "string", "\"\"", "Caffe2's network interface; Ray picks the address"),
            arg!("sync", "bool", "false", "accepted; the world is always ready when the op returns"),
            arg!("mpi_rendezvous", "bool", "false", "must be false: the rendezvous is Ray's"),
            arg!("status_blob", "string", "", "not supported: failures raise"),
        ], "Creates a common world: the members (Nodes of a RaySession) that run collectives together. The optional input (Caffe2's store handler) is ignored: the members find each other through Ray."),
        ("CloneCommonWorld", (1, 1), (1, 1), "never", &[
            arg!("sync", "bool", "false", "accepted"),
            arg!("status_blob", "string", "", "not supported: failures raise"),
        ], "A new common world with the members of an existing one (its own message space)."),
        ("DestroyCommonWorld", (1, 1), (1, 1), "same", &[],
         "Closes a common world; peers waiting in one of its collectives fail at once."),
        ("Allreduce", (2, MANY), (1, MANY), "shift1", &[
            arg!("gpu_direct", "bool", "false", "accepted, no effect (CPU only)"),
            arg!("status_blob", "string", "", "not supported: failures raise"),
        ], "Sums the tensors (in place) element-wise over the members of the common world (input 0): every member ends with the sum. Several tensors are reduced as one buffer."),
        ("Broadcast", (2, MANY), (1, MANY), "shift1", &[
            arg!("root", "int", "0", "the rank whose tensors every member receives"),
            arg!("status_blob", "string", "", "not supported: failures raise"),
        ], "Copies the root member's tensors (in place) to every member of the common world (input 0)."),
        ("Allgather", (2, MANY), (1, 1), "never", &[
            arg!("status_blob", "string", "", "not supported: failures raise"),
        ], "Concatenates, in rank order, every member's tensors (each flattened) into one 1-D tensor on every member."),
        ("Barrier", (1, 1), (0, 0), "never", &[
            arg!("status_blob", "string", "", "not supported: failures raise"),
        ], "Returns when every member of the common world (input 0) has reached it."),
    ]
};

fn inplace_rule(rule: &str) -> Option<ferrocaffe::operator::InPlace> {
    use ferrocaffe::operator::InPlace;
    fn any(_: usize, _: usize) -> bool {
        true
    }
    fn same(i: usize, o: usize) -> bool {
        i == o
    }
    fn shift1(i: usize, o: usize) -> bool {
        i == o + 1
    }
    Some(match rule {
        "never" => InPlace::Never,
        "allow" => InPlace::Allow(any),
        "same" => InPlace::Enforce(same),
        "shift1" => InPlace::Enforce(shift1),
        _ => return None,
    })
}

fn build_named_op(
    ctx: &ferrocaffe::operator::OpDefCtx<'_>,
) -> ferrocaffe::Result<Box<dyn ferrocaffe::operator::Operator>> {
    let spec =
        OP_TYPES.read().get(ctx.op_type()).cloned().ok_or_else(|| {
            ctx.bad_arg("no Python implementation is registered for this op type")
        })?;
    let def = prost::Message::encode_to_vec(ctx.def);
    Python::attach(|py| {
        let r = (|| -> PyResult<Py<PyAny>> {
            let m = py.import("ferrocaffe._python_ops")?;
            Ok(m.getattr("build_named")?
                .call1((spec.as_str(), PyBytes::new(py, &def)))?
                .unbind())
        })();
        r.map_err(|err| {
            let mut e = Error::invalid_arg(format!(
                "cannot build the {} op: {}",
                ctx.op_type(),
                err.value(py)
                    .str()
                    .map(|s| s.to_string())
                    .unwrap_or_default()
            ))
            .with_op(ctx.op_type(), None);
            e.payload = Some(Arc::new(err));
            e
        })
    })
    .map(|func| {
        Box::new(PythonOp {
            func,
            pass_workspace: false,
            with_context: true,
        }) as Box<dyn ferrocaffe::operator::Operator>
    })
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// Registers (or replaces) op type `name`, implemented in Python: its
/// kernels are made by `spec` ("module:function", called with the op's
/// `OperatorDef` bytes through `ferrocaffe._python_ops.build_named`).
/// `args` are `(name, type, default, doc)`; `inplace` is "never", "allow"
/// (any pair), "same" (input i is output i) or "shift1" (input i+1 is
/// output i, Caffe2's collectives). Refuses to replace an op type the core
/// implements.
#[pyfunction]
#[pyo3(signature = (name, spec, inputs, outputs, inplace="never", args=Vec::new(), doc=String::new()))]
pub(crate) fn register_op_type(
    name: String,
    spec: String,
    inputs: (usize, Option<usize>),
    outputs: (usize, Option<usize>),
    inplace: &str,
    args: Vec<(String, String, String, String)>,
    doc: String,
) -> PyResult<()> {
    use ferrocaffe::operator::{ArgDoc, OpSchema, MANY};
    let bad = |msg: String| pyo3::exceptions::PyValueError::new_err(msg);
    if name.is_empty() || !spec.contains(':') {
        return Err(bad(format!(
            "register_op_type needs an op type name and a 'module:function' spec, got {name:?} and {spec:?}"
        )));
    }
    if ferrocaffe::operator::schema(&name).is_some() && !OP_TYPES.read().contains_key(&name) {
        return Err(bad(format!(
            "op type '{name}' is implemented by the core and cannot be replaced"
        )));
    }
    let rule = inplace_rule(inplace).ok_or_else(|| {
        bad(format!(
            "inplace must be 'never', 'allow', 'same' or 'shift1', got {inplace:?}"
        ))
    })?;
    let (imin, imax) = (inputs.0, inputs.1.unwrap_or(MANY));
    let (omin, omax) = (outputs.0, outputs.1.unwrap_or(MANY));
    if imin > imax || omin > omax {
        return Err(bad(format!(
            "op type '{name}': minimum counts above maximum ({inputs:?}, {outputs:?})"
        )));
    }
    let args: Vec<ArgDoc> = args
        .into_iter()
        .map(|(n, t, d, doc)| ArgDoc {
            name: leak(n),
            ty: leak(t),
            default: leak(d),
            doc: leak(doc),
        })
        .collect();
    OP_TYPES.write().insert(name.clone(), spec);
    ferrocaffe::operator::register(
        OpSchema::new(leak(name), build_named_op)
            .inputs(imin, imax)
            .outputs(omin, omax)
            .inplace(rule)
            .args(Box::leak(args.into_boxed_slice()))
            .doc(leak(doc)),
    );
    Ok(())
}

/// Registers the op types ferrocaffe implements in Python (the collectives).
pub(crate) fn register_builtin_op_types() {
    use ferrocaffe::operator::OpSchema;
    for &(name, (imin, imax), (omin, omax), inplace, args, doc) in BUILTIN_OP_TYPES {
        OP_TYPES
            .write()
            .insert(name.to_string(), COLLECTIVE_MODULE.to_string());
        ferrocaffe::operator::register(
            OpSchema::new(name, build_named_op)
                .inputs(imin, imax)
                .outputs(omin, omax)
                .inplace(inplace_rule(inplace).expect("a known in-place rule"))
                .args(args)
                .doc(doc),
        );
    }
}
