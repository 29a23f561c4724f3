//! Operators: a schema (counts, in-place rules, arguments, doc) plus a kernel.
//!
//! The schema is the single source for validation at net creation: every
//! count and in-place error is raised from here, before any op runs. A kernel
//! is built once per op per workspace with its blob handles already bound, so
//! running it does no name lookups.

use crate::args::Args;
use crate::blob::{Blob, BlobValue};
use crate::cancel::CancelToken;
use crate::error::{Error, ErrorKind, Result};
use crate::ir::OperatorDef;
use crate::tensor::Tensor;
use crate::workspace::Workspace;
use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use smallvec::SmallVec;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

/// Which input/output pairs may (or must) name the same blob.
#[derive(Clone, Copy)]
pub enum InPlace {
    /// No output may share a name with an input.
    Never,
    /// `f(input, output)` says which pairs may share a name.
    Allow(fn(usize, usize) -> bool),
    /// `f(input, output)` says which pairs must share a name (and only those may).
    Enforce(fn(usize, usize) -> bool),
    /// `enforce` pairs must share a name; `allow` pairs may (Caffe2's
    /// `EnforceInplace` and `AllowInplace` on one op).
    EnforceAllow {
        enforce: fn(usize, usize) -> bool,
        allow: fn(usize, usize) -> bool,
    },
}

/// One documented argument (defined beside the argument reader).
pub use crate::args::ArgDoc;

/// `arg!(name, type, default, doc)`: an [`ArgDoc`] usable in a `&'static` list.
#[macro_export]
macro_rules! arg {
    ($name:expr, $ty:expr, $default:expr, $doc:expr) => {
        $crate::operator::ArgDoc {
            name: $name,
            ty: $ty,
            default: $default,
            doc: $doc,
        }
    };
}

pub type BuildFn = fn(&OpDefCtx<'_>) -> Result<Box<dyn Operator>>;

/// What shape inference knows of a tensor: its dims and dtype.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShapeInfo {
    pub dims: Vec<i64>,
    pub dtype: crate::tensor::DataType,
}

impl ShapeInfo {
    pub fn new(dims: Vec<i64>, dtype: crate::tensor::DataType) -> ShapeInfo {
        ShapeInfo { dims, dtype }
    }
}

/// An op's shape inference: from its arguments and what is known of its
/// inputs (`None`: unknown), what is known of each of its outputs (one
/// entry per output of the definition, `None` where it cannot be known
/// without running the op). An error means the definition cannot run with
/// such inputs; the walk then reports the outputs unknown.
pub type InferFn = fn(&Args<'_>, &[Option<ShapeInfo>], usize) -> Result<Vec<Option<ShapeInfo>>>;

/// Hints that Caffe2 nets written for other engines (cuDNN, MIOpen, MKL-DNN)
/// carry on any op, often on every op of a net (model helpers put them in an
/// `arg_scope`). Every op accepts and ignores them: none changes what a CPU
/// kernel computes. An op whose own `args` list one of these names gives it
/// its meaning instead (the binary elementwise ops and Concat read `order`).
pub const ENGINE_HINTS: &[ArgDoc] = &[
    arg!(
        "order",
        "string",
        "\"NCHW\"",
        "layout hint (NCHW or NHWC) for ops that have a layout; accepted and ignored"
    ),
    arg!(
        "use_cudnn",
        "bool",
        "true",
        "cuDNN engine hint; accepted and ignored"
    ),
    arg!(
        "cudnn_exhaustive_search",
        "bool",
        "false",
        "cuDNN algorithm search hint; accepted and ignored"
    ),
    arg!(
        "exhaustive_search",
        "bool",
        "false",
        "engine algorithm search hint; accepted and ignored"
    ),
    arg!(
        "ws_nbytes_limit",
        "int",
        "engine default",
        "engine workspace size hint; accepted and ignored"
    ),
];

/// The argument, on an `OperatorDef` or a `NetDef`, that lets the op (or
/// every op of the net, nested nets included) carry arguments its schema does
/// not know; they are then ignored. Set by `core.allow_unknown_arguments` for
/// nets written for Caffe2 builds with other operators. Caffe2 itself ignores
/// it like any unknown argument.
pub const ALLOW_UNKNOWN_ARGS: &str = "ferrocaffe_allow_unknown_arguments";

/// Whether these (op or net) arguments set [`ALLOW_UNKNOWN_ARGS`] to a
/// non-zero int.
pub fn allows_unknown_args(args: &[crate::ir::Argument]) -> bool {
    args.iter()
        .any(|a| a.name.as_deref() == Some(ALLOW_UNKNOWN_ARGS) && a.i.unwrap_or(0) != 0)
}

/// An operator's schema.
#[derive(Clone)]
pub struct OpSchema {
    pub name: &'static str,
    pub min_inputs: usize,
    pub max_inputs: usize,
    pub min_outputs: usize,
    pub max_outputs: usize,
    pub inplace: InPlace,
    pub args: &'static [ArgDoc],
    /// Arguments Caffe2 nets carry for this op that it accepts and ignores
    /// (besides the [`ENGINE_HINTS`]); its kernel never reads them.
    pub ignored: &'static [ArgDoc],
    /// Prefixes of argument names the op reads besides its declared ones
    /// (LearningRate's `sub_policy_<i>_...`, a sub-policy's own arguments).
    pub prefixed: &'static [&'static str],
    pub doc: &'static str,
    pub build: BuildFn,
    /// Shape inference ([`crate::shapes`]); `None`: the outputs are unknown.
    pub infer: Option<InferFn>,
}

pub const MANY: usize = usize::MAX;

impl OpSchema {
    pub const fn new(name: &'static str, build: BuildFn) -> OpSchema {
        OpSchema {
            name,
            min_inputs: 0,
            max_inputs: 0,
            min_outputs: 0,
            max_outputs: 0,
            inplace: InPlace::Never,
            args: &[],
            ignored: &[],
            prefixed: &[],
            doc: "",
            build,
            infer: None,
        }
    }
    /// The op's shape inference (see [`InferFn`]).
    pub const fn infer(mut self, f: InferFn) -> Self {
        self.infer = Some(f);
        self
    }
    pub const fn inputs(mut self, min: usize, max: usize) -> Self {
        self.min_inputs = min;
        self.max_inputs = max;
        self
    }
    pub const fn outputs(mut self, min: usize, max: usize) -> Self {
        self.min_outputs = min;
        self.max_outputs = max;
        self
    }
    pub const fn inplace(mut self, rule: InPlace) -> Self {
        self.inplace = rule;
        self
    }
    pub const fn args(mut self, args: &'static [ArgDoc]) -> Self {
        self.args = args;
        self
    }
    pub const fn ignores(mut self, args: &'static [ArgDoc]) -> Self {
        self.ignored = args;
        self
    }
    /// Accepts any argument whose name starts with one of these prefixes.
    pub const fn prefixed_args(mut self, prefixes: &'static [&'static str]) -> Self {
        self.prefixed = prefixes;
        self
    }
    pub const fn doc(mut self, doc: &'static str) -> Self {
        self.doc = doc;
        self
    }

    fn count_text(min: usize, max: usize) -> String {
        if min == max {
            format!("{min}")
        } else if max == MANY {
            format!("at least {min}")
        } else {
            format!("{min} to {max}")
        }
    }

    /// Whether input `i` and output `o` may be the same blob (in-place).
    pub fn may_share(&self, i: usize, o: usize) -> bool {
        match self.inplace {
            InPlace::Never => false,
            InPlace::Allow(f) | InPlace::Enforce(f) => f(i, o),
            InPlace::EnforceAllow { enforce, allow } => enforce(i, o) || allow(i, o),
        }
    }

    /// Whether input `i` and output `o` must be the same blob.
    pub fn must_share(&self, i: usize, o: usize) -> bool {
        match self.inplace {
            InPlace::Never | InPlace::Allow(_) => false,
            InPlace::Enforce(f) | InPlace::EnforceAllow { enforce: f, .. } => f(i, o),
        }
    }

    /// Checks counts and in-place rules of a definition against this schema.
    pub fn verify(&self, def: &OperatorDef) -> Result<()> {
        let (ni, no) = (def.input.len(), def.output.len());
        if ni < self.min_inputs || ni > self.max_inputs {
            return Err(Error::invalid_arg(format!(
                "operator def did not pass schema checking: {} takes {} inputs, got {ni}",
                self.name,
                Self::count_text(self.min_inputs, self.max_inputs)
            )));
        }
        if no < self.min_outputs || no > self.max_outputs {
            return Err(Error::invalid_arg(format!(
                "operator def did not pass schema checking: {} takes {} outputs, got {no}",
                self.name,
                Self::count_text(self.min_outputs, self.max_outputs)
            )));
        }
        for (i, iname) in def.input.iter().enumerate() {
            for (o, oname) in def.output.iter().enumerate() {
                let same = iname == oname;
                let ok = if same {
                    self.may_share(i, o)
                } else {
                    !self.must_share(i, o)
                };
                if !ok {
                    let msg = if same {
                        format!(
                            "operator def did not pass schema checking: {} does not allow input {i} and output {o} to be the same blob '{iname}' (in-place)",
                            self.name
                        )
                    } else {
                        format!(
                            "operator def did not pass schema checking: {} requires output {o} to be the same blob as input {i} (in-place), got '{oname}' and '{iname}'",
                            self.name
                        )
                    };
                    return Err(Error::invalid_arg(msg).with_blob(iname));
                }
            }
        }
        Ok(())
    }

    /// Whether the op accepts an argument of this name (its own, one it
    /// ignores, or an engine hint).
    pub fn accepts(&self, name: &str) -> bool {
        name == ALLOW_UNKNOWN_ARGS
            || self.known_args().any(|a| a.name == name)
            || self.prefixed.iter().any(|p| name.starts_with(p))
    }

    fn known_args(&self) -> impl Iterator<Item = &'static ArgDoc> {
        self.args
            .iter()
            .chain(self.ignored)
            .chain(ENGINE_HINTS.iter())
    }

    /// Rejects an argument the op does not know, naming the closest known
    /// names, unless unknown arguments are allowed.
    pub fn check_arg_names(&self, def: &OperatorDef, allow_unknown: bool) -> Result<()> {
        if allow_unknown {
            return Ok(());
        }
        let Some(name) = def
            .arg
            .iter()
            .filter_map(|a| a.name.as_deref())
            .find(|n| !self.accepts(n))
        else {
            return Ok(());
        };
        let close = closest_names(name, self.known_args().map(|a| a.name));
        let guess = match close.as_slice() {
            [] => ".".to_string(),
            [one] => format!("; did you mean '{one}'?"),
            many => format!(
                "; did you mean one of {}?",
                many.iter()
                    .map(|n| format!("'{n}'"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        let takes = if self.args.is_empty() {
            format!("{} takes no arguments", self.name)
        } else {
            let own: Vec<&str> = self.args.iter().map(|a| a.name).collect();
            format!("{} takes: {}", self.name, own.join(", "))
        };
        Err(Error::invalid_arg(format!(
            "unknown argument '{name}' for operator {}{guess} {takes} (to run a net written for a Caffe2 \
             build with other operators, ignoring the arguments ferrocaffe does not know, see \
             core.allow_unknown_arguments)",
            self.name
        ))
        .with_op(self.name, None))
    }
}

/// The candidates nearest to `name` by edit distance (a swap of two
/// neighbouring letters counts as one edit), best first: at most three, and
/// only those within a third of the name's length (at least 2 edits).
fn closest_names<'n>(name: &str, candidates: impl Iterator<Item = &'n str>) -> Vec<&'n str> {
    let limit = (name.chars().count() / 3).max(2);
    let mut scored: Vec<(usize, &str)> = candidates
        .map(|c| (edit_distance(name, c), c))
        .filter(|(d, _)| *d <= limit)
        .collect();
    scored.sort();
    scored.dedup_by(|a, b| a.1 == b.1);
    scored.into_iter().take(3).map(|(_, c)| c).collect()
}

/// Optimal string alignment distance: insertions, deletions, substitutions
/// and transpositions of adjacent characters each cost one.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let w = b.len() + 1;
    let mut d = vec![0usize; (a.len() + 1) * w];
    for i in 0..=a.len() {
        for j in 0..=b.len() {
            d[i * w + j] = if i == 0 || j == 0 {
                i + j
            } else {
                let sub = d[(i - 1) * w + j - 1] + usize::from(a[i - 1] != b[j - 1]);
                let mut best = sub.min(d[(i - 1) * w + j] + 1).min(d[i * w + j - 1] + 1);
                if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                    best = best.min(d[(i - 2) * w + j - 2] + 1);
                }
                best
            };
        }
    }
    d[a.len() * w + b.len()]
}

// --------------------------------------------------------------- registry --

// The built-in ops come from the composition root (`crate::builtins`,
// which lists every op family and the readers; this registry and the
// workspaces know none of them): the table fills itself from it on first
// use. Later registrations add or replace (the bindings add `Python`).
static REGISTRY: LazyLock<RwLock<HashMap<&'static str, Arc<OpSchema>>>> = LazyLock::new(|| {
    let table = crate::builtins::schemas()
        .into_iter()
        .map(|s| (s.name, Arc::new(s)))
        .collect();
    RwLock::new(table)
});

/// Registers (or replaces) an operator.
pub fn register(schema: OpSchema) {
    REGISTRY.write().insert(schema.name, Arc::new(schema));
}

pub fn schema(op_type: &str) -> Option<Arc<OpSchema>> {
    REGISTRY.read().get(op_type).cloned()
}

pub fn registered_ops() -> Vec<&'static str> {
    let mut v: Vec<_> = REGISTRY.read().keys().copied().collect();
    v.sort_unstable();
    v
}

// ------------------------------------------------------------ construction --

/// What a kernel's builder sees.
pub struct OpDefCtx<'a> {
    pub def: &'a OperatorDef,
    pub args: Args<'a>,
    pub ws: &'a Arc<Workspace>,
    /// Whether the op may carry arguments its schema does not know (nets
    /// nested in its arguments inherit this).
    pub allow_unknown_args: bool,
}

impl<'a> OpDefCtx<'a> {
    pub fn op_type(&self) -> &'a str {
        self.def.op_type()
    }
    pub fn num_inputs(&self) -> usize {
        self.def.input.len()
    }
    pub fn num_outputs(&self) -> usize {
        self.def.output.len()
    }
    pub fn input_name(&self, i: usize) -> &'a str {
        &self.def.input[i]
    }
    pub fn output_name(&self, i: usize) -> &'a str {
        &self.def.output[i]
    }
    /// The device option's random seed, if one was set.
    pub fn random_seed(&self) -> Option<u32> {
        self.def.device_option.as_ref().and_then(|d| d.random_seed)
    }
    /// An `InvalidArgument` error naming this op.
    pub fn bad_arg(&self, msg: impl Into<String>) -> Error {
        Error::invalid_arg(msg).with_op(self.op_type(), None)
    }

    /// The `epsilon` argument (`default` when absent), under the one rule
    /// every op with an epsilon follows: it must be > 0 (Caffe2's, from
    /// SpatialBN; a NaN is refused too). A negative one made LayerNorm's
    /// square roots NaN, and the optimizers' denominators 0 or negative.
    pub fn epsilon(&self, default: f32) -> Result<f32> {
        let eps = self.args.f32("epsilon", default)?;
        if eps > 0.0 {
            Ok(eps)
        } else {
            Err(self.bad_arg(format!("epsilon must be > 0, got {eps}")))
        }
    }
}

/// The blobs an op is bound to, and the order in which it locks them.
pub struct OpIo {
    pub input_names: Vec<String>,
    pub output_names: Vec<String>,
    pub inputs: Vec<Blob>,
    pub outputs: Vec<Blob>,
    /// Unique blobs in lock order (increasing id), with whether to write-lock.
    lock_order: SmallVec<[(Blob, bool); 4]>,
    in_slot: SmallVec<[usize; 4]>,
    out_slot: SmallVec<[usize; 4]>,
}

impl OpIo {
    /// Binds a definition's names in a workspace: every input must exist, every
    /// output is created (binding to a parent's blob when the name is visible).
    pub fn bind(def: &OperatorDef, ws: &Workspace) -> Result<OpIo> {
        let mut inputs = Vec::with_capacity(def.input.len());
        for name in &def.input {
            let b = ws.get_blob(name).ok_or_else(|| {
                Error::new(
                    ErrorKind::BlobNotFound,
                    format!("encountered a non-existing input blob '{name}'"),
                )
                .with_blob(name)
            })?;
            inputs.push(b);
        }
        let mut outputs = Vec::with_capacity(def.output.len());
        for name in &def.output {
            outputs.push(ws.create_blob(name));
        }
        Ok(OpIo::from_blobs(
            def.input.clone(),
            def.output.clone(),
            inputs,
            outputs,
        ))
    }

    pub fn from_blobs(
        input_names: Vec<String>,
        output_names: Vec<String>,
        inputs: Vec<Blob>,
        outputs: Vec<Blob>,
    ) -> OpIo {
        // Every distinct blob once, in id order (ids are unique per blob),
        // write-locked when any output names it. Sorting instead of a linear
        // search per name keeps binding an op with 100,000 inputs fast.
        let mut all: Vec<(Blob, bool)> = inputs
            .iter()
            .map(|b| (b.clone(), false))
            .chain(outputs.iter().map(|b| (b.clone(), true)))
            .collect();
        all.sort_by_key(|(b, w)| (b.id(), !*w));
        // The write entry of a blob sorts first, so keeping the first keeps it.
        all.dedup_by_key(|(b, _)| b.id());
        // A slot is an index into every distinct blob of the op, which can
        // be as many as its inputs and outputs: usize, so no count of
        // inputs can wrap a slot onto another blob.
        let slot = |b: &Blob| {
            all.binary_search_by_key(&b.id(), |(x, _)| x.id())
                .expect("every blob of the op is in its lock order")
        };
        let in_slot = inputs.iter().map(slot).collect();
        let out_slot = outputs.iter().map(slot).collect();
        OpIo {
            input_names,
            output_names,
            inputs,
            outputs,
            lock_order: all.into_iter().collect(),
            in_slot,
            out_slot,
        }
    }
}

/// A running op's view of its world.
pub struct OpCx<'a> {
    pub io: &'a OpIo,
    pub ws: &'a Arc<Workspace>,
    pub cancel: &'a CancelToken,
}

enum Guard<'a> {
    R(RwLockReadGuard<'a, BlobValue>),
    W(RwLockWriteGuard<'a, BlobValue>),
}

/// All of an op's blobs, locked: inputs readable, outputs writable. Holding it
/// makes the op atomic with respect to every blob it touches.
pub struct Locked<'a> {
    io: &'a OpIo,
    guards: SmallVec<[Guard<'a>; 4]>,
}

impl<'a> OpCx<'a> {
    /// Locks every blob of the op in the global order (no deadlock, even when
    /// an output is also an input).
    #[inline]
    pub fn lock(&self) -> Locked<'a> {
        let mut guards = SmallVec::new();
        for (b, w) in &self.io.lock_order {
            guards.push(if *w {
                Guard::W(b.write())
            } else {
                Guard::R(b.read())
            });
        }
        Locked {
            io: self.io,
            guards,
        }
    }
    pub fn num_inputs(&self) -> usize {
        self.io.inputs.len()
    }
    pub fn num_outputs(&self) -> usize {
        self.io.outputs.len()
    }
    pub fn input_blob(&self, i: usize) -> &'a Blob {
        &self.io.inputs[i]
    }
    pub fn output_blob(&self, i: usize) -> &'a Blob {
        &self.io.outputs[i]
    }
}

// The accessors are inlined: kernels call them on every run.
impl<'a> Locked<'a> {
    #[inline(always)]
    fn slot(&self, s: usize) -> &BlobValue {
        match &self.guards[s] {
            Guard::R(g) => g,
            Guard::W(g) => g,
        }
    }
    #[inline(always)]
    pub fn input(&self, i: usize) -> &BlobValue {
        self.slot(self.io.in_slot[i])
    }
    /// Input `i` as a tensor; a wrong kind names the blob.
    #[inline(always)]
    pub fn tensor(&self, i: usize) -> Result<&Tensor> {
        match self.input(i) {
            BlobValue::Tensor(t) => Ok(t),
            other => Err(other.not_a_tensor().with_blob(&self.io.input_names[i])),
        }
    }
    pub fn input_name(&self, i: usize) -> &str {
        &self.io.input_names[i]
    }
    pub fn output_name(&self, i: usize) -> &str {
        &self.io.output_names[i]
    }
    #[inline]
    pub fn output(&mut self, j: usize) -> &mut BlobValue {
        match &mut self.guards[self.io.out_slot[j]] {
            Guard::W(g) => &mut *g,
            Guard::R(_) => unreachable!("outputs are always write-locked"),
        }
    }
    pub fn set_output(&mut self, j: usize, v: Tensor) {
        *self.output(j) = BlobValue::Tensor(v);
    }
    /// Whether input `i` and output `j` are the same blob.
    #[inline]
    pub fn aliases(&self, i: usize, j: usize) -> bool {
        self.io.in_slot[i] == self.io.out_slot[j]
    }
    /// Output `j` mutably and input `i` shared, when they are different blobs.
    #[inline]
    pub fn output_and_input(&mut self, j: usize, i: usize) -> Option<(&mut BlobValue, &BlobValue)> {
        let (o, s) = (self.io.out_slot[j], self.io.in_slot[i]);
        if o == s {
            return None;
        }
        let (lo, hi) = if o < s { (o, s) } else { (s, o) };
        let (a, b) = self.guards.split_at_mut(hi);
        let (first, second) = (&mut a[lo], &mut b[0]);
        let (out, inp) = if o < s {
            (first, second)
        } else {
            (second, first)
        };
        let out = match out {
            Guard::W(g) => &mut **g,
            Guard::R(_) => unreachable!("outputs are always write-locked"),
        };
        let inp: &BlobValue = match inp {
            Guard::R(g) => g,
            Guard::W(g) => g,
        };
        Some((out, inp))
    }
}

/// A kernel. `Ok(false)` is Caffe2's soft failure (the net stops, no
/// exception); errors carry their own context.
pub trait Operator: Send {
    fn run(&mut self, cx: &mut OpCx<'_>) -> Result<bool>;
}

/// Builds a kernel from a definition, validating it against its schema.
pub fn create_operator(
    def: &OperatorDef,
    ws: &Arc<Workspace>,
) -> Result<(Box<dyn Operator>, OpIo)> {
    create_operator_with(def, ws, false)
}

/// [`create_operator`], with unknown arguments allowed (and ignored) when
/// `allow_unknown_args` is set (the op's net allows them).
pub fn create_operator_with(
    def: &OperatorDef,
    ws: &Arc<Workspace>,
    allow_unknown_args: bool,
) -> Result<(Box<dyn Operator>, OpIo)> {
    let op_type = def.op_type();
    if op_type.is_empty() {
        return Err(Error::new(
            ErrorKind::UnknownOperator,
            "operator def has no type",
        ));
    }
    let schema = schema(op_type).ok_or_else(|| {
        Error::new(
            ErrorKind::UnknownOperator,
            format!("unknown operator type '{op_type}': no such operator is registered"),
        )
        .with_op(op_type, None)
    })?;
    if let Some(dev) = &def.device_option {
        if dev.device_type.unwrap_or(0) != 0 {
            return Err(Error::invalid_arg(format!(
                "cannot create operator of type '{op_type}' on device type {}: only CPU (0) is supported",
                dev.device_type.unwrap_or(0)
            )));
        }
    }
    schema.verify(def)?;
    let allow_unknown_args = allow_unknown_args || allows_unknown_args(&def.arg);
    schema.check_arg_names(def, allow_unknown_args)?;
    let args = Args::new(op_type, &def.arg)?.declared(schema.args);
    let io = OpIo::bind(def, ws)?;
    let ctx = OpDefCtx {
        def,
        args,
        ws,
        allow_unknown_args,
    };
    let kernel = (schema.build)(&ctx)?;
    Ok((kernel, io))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Argument, NetDef};
    use crate::net::Net;
    use crate::test_util::{float_arg, int_arg, net, op};

    fn net_arg(name: &str, n: NetDef) -> Argument {
        Argument {
            name: Some(name.into()),
            n: Some(n),
            ..Default::default()
        }
    }

    fn build_error(def: &OperatorDef) -> Error {
        let ws = Workspace::new();
        create_operator(def, &ws)
            .err()
            .expect("building should fail")
    }

    #[test]
    fn enforce_allow_requires_some_pairs_and_permits_others() {
        fn must(i: usize, o: usize) -> bool {
            (i, o) == (1, 1)
        }
        fn may(i: usize, o: usize) -> bool {
            (i, o) == (0, 0)
        }
        let schema = OpSchema::new("PairTest", |_| Err(Error::internal("not built")))
            .inputs(2, 2)
            .outputs(2, 2)
            .inplace(InPlace::EnforceAllow {
                enforce: must,
                allow: may,
            });
        // (1, 1) in place, (0, 0) either way.
        assert!(schema
            .verify(&op("PairTest", &["a", "b"], &["a", "b"], vec![]))
            .is_ok());
        assert!(schema
            .verify(&op("PairTest", &["a", "b"], &["c", "b"], vec![]))
            .is_ok());
        // (1, 1) not in place; (0, 1) and (1, 0) never.
        for outs in [["a", "c"], ["c", "a"], ["b", "b"]] {
            let e = schema
                .verify(&op("PairTest", &["a", "b"], &outs, vec![]))
                .expect_err("should be refused");
            assert_eq!(e.kind, ErrorKind::InvalidArgument, "{outs:?}: {e}");
        }
    }

    #[test]
    fn an_unknown_argument_names_the_op_the_argument_and_the_closest_names() {
        let e = build_error(&op("ConstantFill", &[], &["c"], vec![int_arg("shap", 2)]));
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert_eq!(e.context.op_type.as_deref(), Some("ConstantFill"));
        assert!(
            e.message.contains(
                "unknown argument 'shap' for operator ConstantFill; did you mean 'shape'?"
            ),
            "{e}"
        );
        assert!(
            e.message
                .contains("ConstantFill takes: value, dtype, shape, extra_shape, input_as_shape"),
            "{e}"
        );
        let e = build_error(&op(
            "UniformFill",
            &[],
            &["u"],
            vec![float_arg("minn", 5.0)],
        ));
        assert!(
            e.message
                .contains("'minn' for operator UniformFill; did you mean 'min'?"),
            "{e}"
        );
        let e = build_error(&op("Scale", &["x"], &["y"], vec![float_arg("scal", 3.0)]));
        assert!(e.message.contains("did you mean 'scale'?"), "{e}");
        // Nothing close: no guess; an op without arguments says so.
        let e = build_error(&op("Copy", &["x"], &["y"], vec![int_arg("zzzzzz", 1)]));
        assert!(
            e.message
                .contains("'zzzzzz' for operator Copy. Copy takes no arguments"),
            "{e}"
        );
        // A misspelled engine hint is caught too.
        let e = build_error(&op("Copy", &["x"], &["y"], vec![int_arg("use_cudn", 1)]));
        assert!(e.message.contains("did you mean 'use_cudnn'?"), "{e}");
    }

    #[test]
    fn engine_hints_and_ignored_arguments_are_accepted() {
        let ws = Workspace::new();
        let mut args: Vec<Argument> = ENGINE_HINTS.iter().map(|h| int_arg(h.name, 1)).collect();
        args[0] = Argument {
            name: Some("order".into()),
            s: Some(b"NHWC".to_vec()),
            ..Default::default()
        };
        args.push(int_arg("run_once", 0));
        args.push(float_arg("value", 2.0));
        let def = op("ConstantFill", &[], &["c"], args.clone());
        assert!(create_operator(&def, &ws).is_ok());
        // Hints on an op without arguments of its own.
        args.truncate(ENGINE_HINTS.len());
        assert!(create_operator(&op("GetAllBlobNames", &[], &["n"], args), &ws).is_ok());
    }

    #[test]
    fn unknown_arguments_can_be_allowed_per_op_and_per_net_nested_nets_included() {
        let ws = Workspace::new();
        let foreign = || op("ConstantFill", &[], &["c"], vec![int_arg("is_test", 1)]);
        assert!(create_operator(&foreign(), &ws).is_err());
        let mut marked = foreign();
        marked.arg.push(int_arg(ALLOW_UNKNOWN_ARGS, 1));
        assert!(create_operator(&marked, &ws).is_ok());
        // Set to 0, the mark allows nothing.
        let mut zero = foreign();
        zero.arg.push(int_arg(ALLOW_UNKNOWN_ARGS, 0));
        assert!(create_operator(&zero, &ws).is_err());

        // A net's mark covers its ops and the nets nested in them.
        ws.create_blob("cond");
        let nested = |inner: NetDef| {
            net(
                "outer",
                vec![op("If", &["cond"], &[], vec![net_arg("then_net", inner)])],
            )
        };
        let e = Net::create(&nested(net("inner", vec![foreign()])), &ws).unwrap_err();
        assert_eq!(e.context.net.as_deref(), Some("inner"));
        let mut outer = nested(net("inner", vec![foreign()]));
        outer.arg.push(int_arg(ALLOW_UNKNOWN_ARGS, 1));
        assert!(Net::create(&outer, &ws).is_ok());
        let mut inner = net("inner", vec![foreign()]);
        inner.arg.push(int_arg(ALLOW_UNKNOWN_ARGS, 1));
        assert!(Net::create(&nested(inner), &ws).is_ok());
    }

    #[test]
    fn closest_names_rank_by_edit_distance() {
        assert_eq!(edit_distance("shap", "shape"), 1);
        assert_eq!(edit_distance("sahpe", "shape"), 1); // one transposition
        assert_eq!(edit_distance("", "abc"), 3);
        let names = ["min", "max", "shape", "extra_shape"];
        assert_eq!(closest_names("minn", names.into_iter()), vec!["min"]);
        assert_eq!(closest_names("mx", names.into_iter()), vec!["max", "min"]);
        assert_eq!(
            closest_names("extrashape", names.into_iter()),
            vec!["extra_shape"]
        );
        assert!(closest_names("wholly_unrelated", names.into_iter()).is_empty());
    }

    #[test]
    fn schema_argument_lists_do_not_overlap() {
        for s in crate::builtins::schemas() {
            for a in s.args {
                assert!(
                    !s.ignored.iter().any(|i| i.name == a.name),
                    "{}: '{}' is both read and ignored",
                    s.name,
                    a.name
                );
            }
            for i in s.ignored {
                assert!(
                    !ENGINE_HINTS.iter().any(|h| h.name == i.name),
                    "{}: '{}' is already an engine hint",
                    s.name,
                    i.name
                );
            }
        }
    }
}
