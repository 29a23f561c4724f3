//! `core.Net`'s op list: [`ferrocaffe::ir::NetOps`] as `_core.NetOps`.
//!
//! Each `core.Net` owns one. Its op methods (`net.Add(...)`) hand
//! [`PyNetOps::add`] the call's arguments and plain values resolved in
//! Python once per call (the name scope, the device scope's bytes, where the
//! user's code made the op, the net's name); nothing here reads Python state
//! (scopes, the environment, frames, modules) or calls back into Python.

use ferrocaffe::ir::{self, ListArg, ScalarArg};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

/// The OperatorDef fields `CreateOperator` takes as keywords (an op given
/// any of them, or `inputs`/`outputs` as keywords, is added by
/// `Net._CreateAndAddToSelf`).
const FIELD_KEYWORDS: [&str; 9] = [
    "name",
    "control_input",
    "device_option",
    "arg",
    "engine",
    "debug_info",
    "random_seed",
    "inputs",
    "outputs",
];

#[pyclass(name = "NetOps", module = "ferrocaffe._core")]
pub struct PyNetOps {
    ops: ir::NetOps,
    /// Where the user's code made each queued op (whatever `core` passes).
    sites: Vec<Py<PyAny>>,
    /// `core.BlobReference`: exactly this class is read as a blob
    /// reference by [`PyNetOps::add`].
    blob_reference: Py<PyAny>,
}

/// A blob given as an input or output, as [`PyNetOps::add`] takes it: a
/// str (the name scope goes in front) or a `core.BlobReference`'s name.
enum Blob<'py> {
    Str(Bound<'py, PyString>),
    Ref(Bound<'py, PyString>),
}

impl Blob<'_> {
    /// The blob's name in the net (None: not UTF-8).
    fn name(&self, scope: &str, buf: &mut String) -> Option<()> {
        buf.clear();
        match self {
            Blob::Str(s) => {
                buf.push_str(scope);
                buf.push_str(s.to_str().ok()?);
            }
            Blob::Ref(s) => buf.push_str(s.to_str().ok()?),
        }
        Some(())
    }
}

/// The blobs of `v` (one blob, or a list or tuple of them); None for
/// anything else.
fn blobs<'py>(v: &Bound<'py, PyAny>, blob_ref: &Bound<'py, PyAny>) -> Option<Vec<Blob<'py>>> {
    let one = |b: Bound<'py, PyAny>| -> Option<Blob<'py>> {
        if b.is_exact_instance_of::<PyString>() {
            Some(Blob::Str(b.cast_into::<PyString>().ok()?))
        } else if b.get_type().is(blob_ref) {
            let name = b.getattr(pyo3::intern!(b.py(), "_name")).ok()?;
            if !name.is_exact_instance_of::<PyString>() {
                return None;
            }
            Some(Blob::Ref(name.cast_into::<PyString>().ok()?))
        } else {
            None
        }
    };
    if let Ok(list) = v.cast::<PyList>() {
        if !v.is_exact_instance_of::<PyList>() {
            return None;
        }
        list.iter().map(one).collect()
    } else if let Ok(tuple) = v.cast::<PyTuple>() {
        if !v.is_exact_instance_of::<PyTuple>() {
            return None;
        }
        tuple.iter().map(one).collect()
    } else {
        Some(vec![one(v.clone())?])
    }
}

/// The serialised Argument `key=v` as `core._MakeArgument` makes it, for
/// the values whose encoding is plain: exactly an int (in int64's range),
/// bool, float (in float32's range), str or bytes, or a list or tuple of
/// floats, of ints and bools, or of str and bytes. None for anything else.
fn argument(key: &str, v: &Bound<'_, PyAny>) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(key.len() + 16);
    if let Some(s) = scalar(v) {
        match s {
            Scalar::F(f) => ir::encode_scalar_arg(&mut out, key, ScalarArg::F(f)),
            Scalar::I(i) => ir::encode_scalar_arg(&mut out, key, ScalarArg::I(i)),
            Scalar::S(s) => ir::encode_scalar_arg(&mut out, key, ScalarArg::S(&s)),
        }
        return Some(out);
    }
    let items: Vec<Bound<'_, PyAny>> = if v.is_exact_instance_of::<PyList>() {
        v.cast::<PyList>().ok()?.iter().collect()
    } else if v.is_exact_instance_of::<PyTuple>() {
        v.cast::<PyTuple>().ok()?.iter().collect()
    } else {
        return None;
    };
    let values: Vec<Scalar> = items.iter().map(scalar).collect::<Option<_>>()?;
    // _MakeArgument's order: all floats (an empty list too), all ints, all
    // str/bytes; a mixture is its error (the general path raises it).
    if values.iter().all(|s| matches!(s, Scalar::F(_))) {
        let fs: Vec<f32> = values
            .iter()
            .map(|s| match s {
                Scalar::F(f) => *f,
                _ => unreachable!(),
            })
            .collect();
        ir::encode_list_arg(&mut out, key, ListArg::Floats(&fs));
    } else if values.iter().all(|s| matches!(s, Scalar::I(_))) {
        let is: Vec<i64> = values
            .iter()
            .map(|s| match s {
                Scalar::I(i) => *i,
                _ => unreachable!(),
            })
            .collect();
        ir::encode_list_arg(&mut out, key, ListArg::Ints(&is));
    } else if values.iter().all(|s| matches!(s, Scalar::S(_))) {
        let ss: Vec<&[u8]> = values
            .iter()
            .map(|s| match s {
                Scalar::S(b) => b.as_slice(),
                _ => unreachable!(),
            })
            .collect();
        ir::encode_list_arg(&mut out, key, ListArg::Strings(&ss));
    } else {
        return None;
    }
    Some(out)
}

enum Scalar {
    F(f32),
    I(i64),
    S(Vec<u8>),
}

fn scalar(v: &Bound<'_, PyAny>) -> Option<Scalar> {
    if v.is_exact_instance_of::<PyBool>() {
        Some(Scalar::I(v.extract::<bool>().ok()? as i64))
    } else if v.is_exact_instance_of::<PyInt>() {
        Some(Scalar::I(v.extract().ok()?))
    } else if v.is_exact_instance_of::<PyFloat>() {
        let f: f64 = v.extract().ok()?;
        let narrow = f as f32;
        // Beyond float32's range: protobuf's rule, left to the general path.
        if narrow.is_infinite() && f.is_finite() {
            return None;
        }
        Some(Scalar::F(narrow))
    } else if v.is_exact_instance_of::<PyString>() {
        Some(Scalar::S(
            v.cast::<PyString>()
                .ok()?
                .to_str()
                .ok()?
                .as_bytes()
                .to_vec(),
        ))
    } else if v.is_exact_instance_of::<PyBytes>() {
        Some(Scalar::S(v.cast::<PyBytes>().ok()?.as_bytes().to_vec()))
    } else {
        None
    }
}

fn strs(list: &Bound<'_, PyList>) -> PyResult<Vec<String>> {
    list.iter().map(|s| s.extract::<String>()).collect()
}

#[pymethods]
impl PyNetOps {
    #[new]
    fn new(blob_reference: Py<PyAny>) -> Self {
        PyNetOps {
            ops: ir::NetOps::new(),
            sites: Vec::new(),
            blob_reference,
        }
    }

    /// Adds the op `net.<op_type>(*args, **kwargs)` makes when it is the
    /// common one: inputs and outputs are str names or `BlobReference`s
    /// (one, or a list or tuple), every input defined, no OperatorDef field
    /// among the keywords, every argument of a plain type (see
    /// [`argument`]), and the tables current. `name_scope` goes in front of
    /// str names; `device` is the device scope's serialised DeviceOption;
    /// `site` is kept beside the op; `net_name` makes an automatic output
    /// name. Returns the output name (one output) or a tuple of them; None
    /// when the op is not such an op, and then nothing was done.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (op_type, args, kwargs, name_scope, device, site, net_name))]
    fn add<'py>(
        &mut self,
        py: Python<'py>,
        op_type: &Bound<'py, PyString>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
        name_scope: &str,
        device: Option<&Bound<'py, PyBytes>>,
        site: Py<PyAny>,
        net_name: &str,
    ) -> PyResult<Option<Py<PyAny>>> {
        if self.ops.is_stale() {
            return Ok(None);
        }
        let (inputs, outputs) = match args.len() {
            1 => (args.get_item(0)?, None),
            2 => (
                args.get_item(0)?,
                Some(args.get_item(1)?).filter(|o| !o.is_none()),
            ),
            _ => return Ok(None),
        };
        let Ok(op_type_str) = op_type.to_str() else {
            return Ok(None);
        };
        // Arguments first: nothing is changed before the op is known to be
        // a common one.
        let mut arg_bytes: Vec<Vec<u8>> = Vec::new();
        if let Some(kw) = kwargs {
            for (k, v) in kw.iter() {
                let Ok(key) = k.cast::<PyString>() else {
                    return Ok(None);
                };
                let Ok(key) = key.to_str() else {
                    return Ok(None);
                };
                if FIELD_KEYWORDS.contains(&key) {
                    return Ok(None);
                }
                if v.is_none() {
                    continue;
                }
                match argument(key, &v) {
                    Some(b) => arg_bytes.push(b),
                    None => return Ok(None),
                }
            }
        }
        let blob_ref = self.blob_reference.bind(py);
        let Some(ins) = blobs(&inputs, blob_ref) else {
            return Ok(None);
        };
        let outs = match &outputs {
            None => None,
            Some(o) => match blobs(o, blob_ref) {
                Some(v) => Some(v),
                None => return Ok(None),
            },
        };
        let mut buf = String::new();
        let mut in_names = Vec::with_capacity(ins.len());
        for b in &ins {
            if b.name(name_scope, &mut buf).is_none() || !self.ops.is_defined(&buf) {
                return Ok(None);
            }
            in_names.push(buf.clone());
        }
        let mut out_names = Vec::new();
        match outs {
            Some(outs) => {
                for b in &outs {
                    if b.name(name_scope, &mut buf).is_none() {
                        return Ok(None);
                    }
                    out_names.push(buf.clone());
                }
            }
            None => {
                let name = self
                    .ops
                    .next_name(net_name, Some(op_type_str), None, name_scope);
                out_names.push(format!("{name_scope}{name}"));
            }
        }
        let ins: Vec<&str> = in_names.iter().map(String::as_str).collect();
        let outs: Vec<&str> = out_names.iter().map(String::as_str).collect();
        let args: Vec<&[u8]> = arg_bytes.iter().map(Vec::as_slice).collect();
        self.ops.push(&ir::OpFields {
            op_type: op_type_str,
            name: "",
            inputs: &ins,
            outputs: &outs,
            args: &args,
            device_option: device.map(|d| d.as_bytes()),
        });
        self.sites.push(site);
        Ok(Some(if out_names.len() == 1 {
            PyString::new(py, &out_names[0]).into_any().unbind()
        } else {
            PyTuple::new(py, &out_names)?.into_any().unbind()
        }))
    }

    /// Queues an op with these fields (names as given, arguments
    /// serialised), made where `site` says.
    fn push(
        &mut self,
        op_type: &str,
        inputs: &Bound<'_, PyList>,
        outputs: &Bound<'_, PyList>,
        args: &Bound<'_, PyList>,
        site: Py<PyAny>,
    ) -> PyResult<()> {
        let (inputs, outputs) = (strs(inputs)?, strs(outputs)?);
        let args: Vec<Bound<'_, PyBytes>> = args
            .iter()
            .map(|a| a.cast_into::<PyBytes>().map_err(PyErr::from))
            .collect::<PyResult<_>>()?;
        let ins: Vec<&str> = inputs.iter().map(String::as_str).collect();
        let outs: Vec<&str> = outputs.iter().map(String::as_str).collect();
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        self.ops.push(&ir::OpFields {
            op_type,
            name: "",
            inputs: &ins,
            outputs: &outs,
            args: &args,
            device_option: None,
        });
        self.sites.push(site);
        Ok(())
    }

    /// Queues a serialised OperatorDef writing `outputs`.
    fn push_encoded(
        &mut self,
        op: &Bound<'_, PyBytes>,
        outputs: &Bound<'_, PyList>,
        site: Py<PyAny>,
    ) -> PyResult<()> {
        let outputs = strs(outputs)?;
        self.ops
            .push_encoded(op.as_bytes(), outputs.iter().map(String::as_str));
        self.sites.push(site);
        Ok(())
    }

    /// How many ops are queued.
    #[getter]
    fn queued(&self) -> usize {
        self.ops.queued()
    }

    /// The queued ops as `NetDef.op` entries (bytes to merge into the
    /// NetDef) and their sites, in order; the queue is then empty.
    fn take<'py>(
        &mut self,
        py: Python<'py>,
    ) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyList>)> {
        let (bytes, _) = self.ops.take();
        let sites = PyList::new(py, std::mem::take(&mut self.sites))?;
        Ok((PyBytes::new(py, &bytes), sites))
    }

    /// Records blobs an op of the net writes.
    fn define(&mut self, outputs: &Bound<'_, PyList>) -> PyResult<()> {
        let outputs = strs(outputs)?;
        self.ops.define(outputs.iter().map(String::as_str));
        Ok(())
    }

    fn add_external_input(&mut self, name: &str) {
        self.ops.add_external_input(name);
    }

    fn is_defined(&self, name: &str) -> bool {
        self.ops.is_defined(name)
    }

    fn is_op_output(&self, name: &str) -> bool {
        self.ops.is_op_output(name)
    }

    fn is_external_input(&self, name: &str) -> bool {
        self.ops.is_external_input(name)
    }

    /// The tables may no longer match the NetDef.
    fn invalidate(&mut self) {
        self.ops.invalidate();
    }

    #[getter]
    fn stale(&self) -> bool {
        self.ops.is_stale()
    }

    /// Rebuilds the tables from the NetDef's op outputs and external inputs.
    fn reset(
        &mut self,
        op_outputs: &Bound<'_, PyList>,
        external_inputs: &Bound<'_, PyList>,
    ) -> PyResult<()> {
        let (outs, ext) = (strs(op_outputs)?, strs(external_inputs)?);
        self.ops.reset(
            outs.iter().map(String::as_str),
            ext.iter().map(String::as_str),
        );
        Ok(())
    }

    /// Caffe2's automatic name (see `ir::NetOps::next_name`).
    #[pyo3(signature = (net_name, prefix, output_id, name_scope))]
    fn next_name(
        &mut self,
        net_name: &str,
        prefix: Option<&str>,
        output_id: Option<&str>,
        name_scope: &str,
    ) -> String {
        self.ops.next_name(net_name, prefix, output_id, name_scope)
    }

    #[getter]
    fn get_next_blob_index(&self) -> u64 {
        self.ops.next_blob_index()
    }

    #[setter]
    fn set_next_blob_index(&mut self, index: u64) {
        self.ops.set_next_blob_index(index);
    }

    /// The `_<k>` suffixes automatic names try next, by name (kept when a
    /// net is pickled).
    #[getter]
    fn get_next_suffixes(&self) -> std::collections::HashMap<String, u64> {
        self.ops.next_suffixes().clone()
    }

    #[setter]
    fn set_next_suffixes(&mut self, suffixes: std::collections::HashMap<String, u64>) {
        self.ops.set_next_suffixes(suffixes);
    }
}
