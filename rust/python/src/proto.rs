//! What Python's protobuf layer needs from the runtime: the compiled schema
//! (exported as `_core.CAFFE2_FILE_DESCRIPTOR_SET` in `lib.rs`) and the
//! encoder of `core.Net`'s queued ops.

use ferrocaffe::ir;
use pyo3::prelude::*;
use pyo3::types::{IntoPyDict, PyBytes, PyDict, PyList, PyString, PyTuple};

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

// ------------------------------------------------- core.Net's op methods --

/// What `core.Net`'s op methods need from Python, handed over once by
/// `core` (`_core.NetOpHelpers(...)`).
#[pyclass(name = "NetOpHelpers", module = "ferrocaffe._core", frozen)]
pub struct NetOpHelpers {
    /// `core.BlobReference` (only exactly this class takes the fast path).
    blob_reference: Py<PyAny>,
    /// `core._user_frame`: where the user's code made the op.
    user_frame: Py<PyAny>,
    /// The package's directory (`core._PACKAGE_DIR`): given, the op
    /// methods find the user's frame themselves, as `_user_frame` does.
    package_dir: Option<String>,
    /// `core._argument_bytes(key, value, op_type)`: the general encoder.
    argument_bytes: Py<PyAny>,
    /// `scope._threadlocal_scope`, and `scope.CurrentNameScope` for a
    /// thread that has no name scope yet.
    scope_local: Py<PyAny>,
    current_name_scope: Py<PyAny>,
    /// The environment as `core._caffe2_debug` reads it (`os.environ._data`
    /// on CPython) and the key of `CAFFE2_DEBUG` in it.
    environ: Py<PyAny>,
    debug_key: Py<PyAny>,
    /// The OperatorDef fields given as keywords (`name`, `engine`, ...),
    /// and `inputs` and `outputs`: an op with any of them as a keyword takes
    /// the general path.
    field_keywords: Py<PyAny>,
    /// `sys.modules` (is `ferrocaffe.workspace` in immediate mode?).
    modules: Py<PyAny>,
}

#[pymethods]
impl NetOpHelpers {
    #[new]
    #[pyo3(signature = (blob_reference, user_frame, argument_bytes, scope_local,
        current_name_scope, environ, debug_key, field_keywords, modules, package_dir=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        blob_reference: Py<PyAny>,
        user_frame: Py<PyAny>,
        argument_bytes: Py<PyAny>,
        scope_local: Py<PyAny>,
        current_name_scope: Py<PyAny>,
        environ: Py<PyAny>,
        debug_key: Py<PyAny>,
        field_keywords: Py<PyAny>,
        modules: Py<PyAny>,
        package_dir: Option<String>,
    ) -> Self {
        NetOpHelpers {
            blob_reference,
            user_frame,
            package_dir,
            argument_bytes,
            scope_local,
            current_name_scope,
            environ,
            debug_key,
            field_keywords,
            modules,
        }
    }
}

/// `Net.<OpType>`: an op method, kept on the `Net` class. `net.Add(...)`
/// binds it to the net ([`BoundOpMethod`]).
#[pyclass(name = "OpMethod", module = "ferrocaffe._core", frozen)]
pub struct OpMethod {
    op_type: Py<PyString>,
    helpers: Py<NetOpHelpers>,
}

#[pymethods]
impl OpMethod {
    #[new]
    fn new(op_type: Bound<'_, PyString>, helpers: Py<NetOpHelpers>) -> Self {
        OpMethod {
            op_type: op_type.unbind(),
            helpers,
        }
    }

    #[getter]
    fn __name__(&self, py: Python<'_>) -> Py<PyString> {
        self.op_type.clone_ref(py)
    }

    /// `net.<OpType>(*args, **kwargs)` given the net, the positional
    /// arguments as a tuple and the keywords as a dict (or None): what
    /// `core`'s op methods call, with no bound object made per call.
    #[pyo3(signature = (net, args, kwargs=None))]
    fn call<'py>(
        &self,
        py: Python<'py>,
        net: &Bound<'py, PyAny>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Py<PyAny>> {
        call_op(py, net, self, args, kwargs)
    }

    fn __get__(
        slf: Bound<'_, Self>,
        obj: Option<Bound<'_, PyAny>>,
        _owner: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        match obj {
            Some(net) if !net.is_none() => Ok(Py::new(
                py,
                BoundOpMethod {
                    net: net.unbind(),
                    method: slf.unbind(),
                },
            )?
            .into_any()),
            _ => Ok(slf.into_any().unbind()),
        }
    }
}

/// An op method bound to a net: calling it adds the op.
#[pyclass(name = "BoundOpMethod", module = "ferrocaffe._core", frozen)]
pub struct BoundOpMethod {
    net: Py<PyAny>,
    method: Py<OpMethod>,
}

#[pymethods]
impl BoundOpMethod {
    #[getter]
    fn __name__(&self, py: Python<'_>) -> Py<PyString> {
        self.method.get().op_type.clone_ref(py)
    }

    /// `net.<OpType>(inputs, outputs=None, **kwargs)`: the op's output
    /// reference(s), as `Net._CreateAndAddToSelf` returns them. The common
    /// op is added here; any other goes through `_CreateAndAddToSelf`.
    #[pyo3(signature = (*args, **kwargs))]
    fn __call__<'py>(
        &self,
        py: Python<'py>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Py<PyAny>> {
        call_op(py, self.net.bind(py), self.method.get(), args, kwargs)
    }
}

/// Adds the op `method` names to `net`: the common op here
/// ([`add_op_fast`]), any other through `Net._CreateAndAddToSelf`.
fn call_op<'py>(
    py: Python<'py>,
    net: &Bound<'py, PyAny>,
    method: &OpMethod,
    args: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Py<PyAny>> {
    let op_type = method.op_type.bind(py);
    if let Some(r) = add_op_fast(py, net, op_type, method.helpers.get(), args, kwargs)? {
        return Ok(r);
    }
    let mut all = Vec::with_capacity(args.len() + 1);
    all.push(op_type.clone().into_any());
    all.extend(args.iter());
    net.call_method(
        pyo3::intern!(py, "_CreateAndAddToSelf"),
        PyTuple::new(py, all)?,
        kwargs,
    )
    .map(Bound::unbind)
}

/// A blob given as an input or output, as the fast path takes it: a str
/// (the name scope is put in front) or exactly a `core.BlobReference`.
enum Blob<'py> {
    Str(Bound<'py, PyString>),
    Ref(Bound<'py, PyAny>),
}

/// The blobs of `v` (one blob, or a list or tuple of them); `None` for
/// anything else (the general path decides).
fn blobs<'py>(v: &Bound<'py, PyAny>, blob_ref: &Bound<'py, PyAny>) -> Option<Vec<Blob<'py>>> {
    let one = |b: &Bound<'py, PyAny>| {
        if b.is_exact_instance_of::<PyString>() {
            Some(Blob::Str(b.clone().cast_into::<PyString>().ok()?))
        } else if b.get_type().is(blob_ref) {
            Some(Blob::Ref(b.clone()))
        } else {
            None
        }
    };
    if v.is_exact_instance_of::<PyList>() || v.is_exact_instance_of::<PyTuple>() {
        v.try_iter().ok()?.map(|b| one(&b.ok()?)).collect()
    } else {
        Some(vec![one(v)?])
    }
}

/// Adds the common op (see `Net._CreateAndAddToSelf`): plain names or
/// references, every input already defined, no OperatorDef field among the
/// keywords, no device scope, neither `CAFFE2_DEBUG` nor immediate mode.
/// The op's fields are queued as one serialised OperatorDef in
/// `net._pending`, exactly what the general path queues. `None`: not such
/// an op, nothing was done.
fn add_op_fast<'py>(
    py: Python<'py>,
    net: &Bound<'py, PyAny>,
    op_type: &Bound<'py, PyString>,
    h: &NetOpHelpers,
    args: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Option<Py<PyAny>>> {
    use pyo3::intern;
    use pyo3::types::{PySet, PyString};
    let (inputs, outputs) = match args.len() {
        1 => (args.get_item(0)?, None),
        2 => (args.get_item(0)?, Some(args.get_item(1)?)),
        _ => return Ok(None),
    };
    let fields = h.field_keywords.bind(py);
    if let Some(kw) = kwargs {
        for (k, _) in kw.iter() {
            if fields.contains(&k)? {
                return Ok(None);
            }
        }
    }
    // The state the general path checks.
    let local = h.scope_local.bind(py);
    match local.getattr(intern!(py, "devicescope")) {
        Ok(d) if d.is_none() => {}
        _ => return Ok(None),
    }
    // (Dict lookups that find nothing return None here: a KeyError raised
    // and caught would cost more than the rest of the op.)
    let environ = h.environ.bind(py);
    let debug = match environ.cast::<PyDict>() {
        Ok(d) => d.get_item(h.debug_key.bind(py))?,
        Err(_) => environ.get_item(h.debug_key.bind(py)).ok(),
    };
    if let Some(v) = debug {
        if v.is_truthy()? {
            return Ok(None);
        }
    }
    let modules = h.modules.bind(py).cast::<PyDict>()?;
    if let Some(ws) = modules.get_item(intern!(py, "ferrocaffe.workspace"))? {
        if let Ok(m) = ws.getattr(intern!(py, "_immediate_mode")) {
            if m.is_truthy()? {
                return Ok(None);
            }
        }
    }
    // The net's state, read from its __dict__ (an attribute lookup on a
    // Net goes through the class and its __getattr__ hook first); a net
    // whose state is not there, or not of the usual types, takes the
    // general path.
    let Ok(dict) = net.getattr(intern!(py, "__dict__"))?.cast_into::<PyDict>() else {
        return Ok(None);
    };
    match dict.get_item(intern!(py, "_recreate_lookup_tables"))? {
        Some(v) if !v.is_truthy()? => {}
        _ => return Ok(None),
    }
    let state =
        |key: &Bound<'py, PyString>| -> PyResult<Option<Bound<'py, PyAny>>> { dict.get_item(key) };
    let Some(Ok(op_outputs)) = state(intern!(py, "_op_outputs"))?.map(|s| s.cast_into::<PySet>())
    else {
        return Ok(None);
    };
    let Some(Ok(external)) =
        state(intern!(py, "_external_input_map"))?.map(|s| s.cast_into::<PySet>())
    else {
        return Ok(None);
    };
    let Some(Ok(pending)) = state(intern!(py, "_pending"))?.map(|s| s.cast_into::<PyList>()) else {
        return Ok(None);
    };
    let Some(Ok(sites)) = state(intern!(py, "_pending_sites"))?.map(|s| s.cast_into::<PyList>())
    else {
        return Ok(None);
    };
    let blob_ref = h.blob_reference.bind(py);
    let Some(ins) = blobs(&inputs, blob_ref) else {
        return Ok(None);
    };
    let outs = match &outputs {
        None => None,
        Some(o) if o.is_none() => None,
        Some(o) => match blobs(o, blob_ref) {
            Some(v) => Some(v),
            None => return Ok(None),
        },
    };
    let mut prefix: Option<Bound<'py, PyString>> = None;
    let mut name_scope = || -> PyResult<Bound<'py, PyString>> {
        if let Some(p) = &prefix {
            return Ok(p.clone());
        }
        let p = match local.getattr(intern!(py, "namescope")) {
            Ok(p) => p,
            Err(_) => h.current_name_scope.bind(py).call0()?,
        }
        .cast_into::<PyString>()?;
        prefix = Some(p.clone());
        Ok(p)
    };
    let scoped =
        |s: &Bound<'py, PyString>, p: &Bound<'py, PyString>| -> PyResult<Bound<'py, PyString>> {
            if p.to_str()?.is_empty() {
                Ok(s.clone())
            } else {
                Ok(p.add(s)?.cast_into::<PyString>()?)
            }
        };
    let name_attr = intern!(py, "_name");
    let mut in_names = Vec::with_capacity(ins.len());
    for b in &ins {
        let name = match b {
            Blob::Str(s) => scoped(s, &name_scope()?)?,
            Blob::Ref(r) => match r.getattr(name_attr)?.cast_into::<PyString>() {
                Ok(s) => s,
                Err(_) => return Ok(None),
            },
        };
        if name.to_str().is_err() || !(op_outputs.contains(&name)? || external.contains(&name)?) {
            return Ok(None);
        }
        in_names.push(name);
    }
    // Outputs: one automatic name, or the names given. A str output is
    // returned as the reference made for it.
    let outs = match outs {
        Some(v) => v,
        None => {
            let name = net
                .call_method(
                    intern!(py, "NextName"),
                    (),
                    Some(&[(intern!(py, "prefix"), op_type)].into_py_dict(py)?),
                )?
                .cast_into::<PyString>()?;
            vec![Blob::Str(name)]
        }
    };
    let mut out_names = Vec::with_capacity(outs.len());
    for b in &outs {
        let name = match b {
            Blob::Str(s) => scoped(s, &name_scope()?)?,
            Blob::Ref(r) => match r.getattr(name_attr)?.cast_into::<PyString>() {
                Ok(s) => s,
                Err(_) => return Ok(None),
            },
        };
        if name.to_str().is_err() {
            return Ok(None);
        }
        out_names.push(name);
    }
    // Arguments: the scalars encoded here, the rest by core._argument_bytes.
    let mut arg_bytes: Vec<Vec<u8>> = Vec::new();
    let mut py_args: Vec<Bound<'py, PyBytes>> = Vec::new();
    let mut order: Vec<(bool, usize)> = Vec::new();
    if let Some(kw) = kwargs {
        for (k, v) in kw.iter() {
            if v.is_none() {
                continue;
            }
            if let Some(bytes) = scalar_arg(&k, &v) {
                order.push((true, arg_bytes.len()));
                arg_bytes.push(bytes);
            } else {
                let b = h
                    .argument_bytes
                    .bind(py)
                    .call1((k, v, op_type))?
                    .cast_into::<PyBytes>()?;
                order.push((false, py_args.len()));
                py_args.push(b);
            }
        }
    }
    let arg_refs: Vec<&[u8]> = order
        .iter()
        .map(|&(mine, i)| {
            if mine {
                arg_bytes[i].as_slice()
            } else {
                py_args[i].as_bytes()
            }
        })
        .collect();
    let ins_str: Vec<&str> = in_names
        .iter()
        .map(|s| s.to_str())
        .collect::<PyResult<_>>()?;
    let outs_str: Vec<&str> = out_names
        .iter()
        .map(|s| s.to_str())
        .collect::<PyResult<_>>()?;
    let mut op = Vec::with_capacity(64);
    ir::encode_op_fields(
        &mut op,
        &ir::OpFields {
            op_type: op_type.to_str()?,
            name: "",
            inputs: &ins_str,
            outputs: &outs_str,
            args: &arg_refs,
        },
    );
    // Where the user's code made the op, for PopulateProtoWithFileName:
    // queued beside the op (`Net._flush` gives it the op's index).
    let site = match &h.package_dir {
        Some(dir) => user_frame(py, dir)?,
        None => h.user_frame.bind(py).call0()?,
    };
    pending.append(PyBytes::new(py, &op))?;
    sites.append(site)?;
    for n in &out_names {
        op_outputs.add(n)?;
    }
    let make_ref = |name: &Bound<'py, PyString>| blob_ref.call1((name, net));
    Ok(Some(match out_names.len() {
        0 => py.None(),
        1 => make_ref(&out_names[0])?.unbind(),
        _ => PyTuple::new(
            py,
            out_names
                .iter()
                .map(make_ref)
                .collect::<PyResult<Vec<_>>>()?,
        )?
        .into_any()
        .unbind(),
    }))
}

/// `core._user_frame()` without a Python call: `(code, instruction
/// offset)` of the innermost Python frame whose file is not under
/// `package_dir`, or None.
fn user_frame<'py>(py: Python<'py>, package_dir: &str) -> PyResult<Bound<'py, PyAny>> {
    use pyo3::intern;
    // SAFETY: the GIL is held; PyEval_GetFrame returns a borrowed reference
    // to the running Python frame (the caller's), or NULL when there is none.
    let current = unsafe { pyo3::ffi::PyEval_GetFrame() };
    if current.is_null() {
        return Ok(py.None().into_bound(py));
    }
    // SAFETY: a valid, borrowed frame object (checked non-null above).
    let mut frame = unsafe { Bound::from_borrowed_ptr(py, current.cast()) };
    loop {
        let code = frame.getattr(intern!(py, "f_code"))?;
        let file = code.getattr(intern!(py, "co_filename"))?;
        let inside = match file.cast::<PyString>() {
            Ok(f) => f.to_str().is_ok_and(|f| f.starts_with(package_dir)),
            Err(_) => false,
        };
        if !inside {
            let offset = frame.getattr(intern!(py, "f_lasti"))?;
            return Ok(PyTuple::new(py, [code, offset])?.into_any());
        }
        let back = frame.getattr(intern!(py, "f_back"))?;
        if back.is_none() {
            return Ok(back);
        }
        frame = back;
    }
}

/// The serialised Argument for a keyword whose value is exactly an int
/// (in int64's range), bool, float (in float32's range), str or bytes, as
/// `core._MakeArgument` makes it; `None` for anything else.
fn scalar_arg(key: &Bound<'_, PyAny>, v: &Bound<'_, PyAny>) -> Option<Vec<u8>> {
    use pyo3::types::{PyBool, PyFloat, PyInt};
    let key = key.cast::<PyString>().ok()?;
    let key = key.to_str().ok()?;
    let mut out = Vec::with_capacity(key.len() + 16);
    if v.is_exact_instance_of::<PyBool>() {
        let b: bool = v.extract().ok()?;
        ir::encode_scalar_arg(&mut out, key, ir::ScalarArg::I(b as i64));
    } else if v.is_exact_instance_of::<PyInt>() {
        let i: i64 = v.extract().ok()?;
        ir::encode_scalar_arg(&mut out, key, ir::ScalarArg::I(i));
    } else if v.is_exact_instance_of::<PyFloat>() {
        let f: f64 = v.extract().ok()?;
        let narrow = f as f32;
        if narrow.is_infinite() && f.is_finite() {
            return None;
        }
        ir::encode_scalar_arg(&mut out, key, ir::ScalarArg::F(narrow));
    } else if v.is_exact_instance_of::<PyString>() {
        let s = v.cast::<PyString>().ok()?.to_str().ok()?;
        ir::encode_scalar_arg(&mut out, key, ir::ScalarArg::S(s.as_bytes()));
    } else if v.is_exact_instance_of::<PyBytes>() {
        let s = v.cast::<PyBytes>().ok()?.as_bytes();
        ir::encode_scalar_arg(&mut out, key, ir::ScalarArg::S(s));
    } else {
        return None;
    }
    Some(out)
}
