//! `RecurrentNetwork`: a step net run once per timestep over a sequence,
//! and `RecurrentNetworkGradient`, its backward step net run from the last
//! timestep to the first (Caffe2's arguments and blob names; the Python
//! side is `recurrent.recurrent_net`).
//!
//! Caffe2 pointed the step net's blobs into the outer tensors (a link made
//! `hidden_t_prev` a view of row `t` of the states) and kept a workspace per
//! timestep so the backward pass found each step's intermediate blobs.
//! Tensors here are values (copy on write), so a link copies: before step
//! `t` each link's internal blob gets rows `t + offset ..` of its external
//! tensor, and after it a link whose internal blob the step net writes is
//! copied back there. There is one step workspace per op (a child of the
//! op's workspace, made on the first run and kept in the op's last output,
//! Caffe2's `step_workspaces`): after each forward step the values of its
//! local blobs are kept (shared buffers, no copy) in a slot per timestep,
//! and the backward pass puts step `t`'s values back before running the
//! backward step net for `t`. No workspace is made per timestep or per run.
//!
//! What the copies cost is kept down where the links' rules allow it: a
//! read link whose rows the previous step's written link just wrote takes
//! that value instead (`forwarded_links`); the step FC's weight gradient
//! is one product over the sequence, its dY read where dY's link wrote it
//! (`dy_links`); and the states, their gradients and the sequence's
//! gradient reuse the last run's tensors instead of zeros when the links
//! write each row before any link reads it (`state_rows_rewritten`,
//! `grad_rows_rewritten`, `rows_covered`). The copies that remain are made
//! by an idle pool thread where one is spinning and they are long enough
//! (`deferred_links`, `links_out`, `read_ahead`): a step's rows go out
//! while the next step runs, and the next step's constant rows come in
//! while this one runs.

use super::super::kit::{by_dtype, kernel};
use crate::arg;
use crate::blob::{Blob, BlobObject, BlobValue};
use crate::error::{Error, Result};
use crate::ir::{Argument, NetDef, OperatorDef};
use crate::net::Net;
use crate::num::Float;
use crate::operator::{ArgDoc, InPlace, OpCx, OpDefCtx, OpSchema, Operator, MANY};
use crate::ops::matmul::FcGradSteps;
use crate::tensor::{Element, Tensor};
use crate::workspace::Workspace;
use ndarray::{ArrayD, Axis, IxDyn, Slice};
use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::Arc;

const RNN_ARGS: &[ArgDoc] = &[
    arg!("step_net", "NetDef", "required", "the net run once per timestep"),
    arg!("backward_step_net", "NetDef", "none", "the gradient of the step net (none: forward only, no step is kept)"),
    arg!("recurrent_states", "strings", "[]", "the states: (T + k, N, D) tensors made in the op's workspace"),
    arg!("initial_recurrent_state_ids", "ints", "[]", "for each state, the input holding its first k rows ((k, N, D), (N, D), or (D) repeated over the batch)"),
    arg!("link_internal", "strings", "[]", "step net blobs linked to rows of outer tensors"),
    arg!("link_external", "strings", "[]", "the outer tensor of each link"),
    arg!("link_offset", "ints", "[]", "row t + offset of the external tensor is linked at step t"),
    arg!("link_window", "ints", "1 each", "how many rows each link takes"),
    arg!("alias_src", "strings", "[]", "states copied to outputs after the last step"),
    arg!("alias_dst", "strings", "[]", "the output of each alias"),
    arg!("alias_offset", "ints", "[]", "the first row copied (negative: from the end)"),
    arg!("timestep", "string", "\"timestep\"", "the step net's int32 blob holding t"),
    arg!("recompute_blobs_on_backward", "strings", "[]", "step blobs the backward step net computes again, so they are not kept per step"),
    arg!("outputs_with_grads", "ints", "[0]", "(gradient) the outputs whose gradients are the op's first inputs"),
    arg!("param", "ints", "[]", "(gradient) the inputs that are parameters of the step net"),
    arg!("param_grads", "strings", "[]", "(gradient) each parameter's gradient blob in the backward step net"),
    arg!("backward_link_internal", "strings", "[]", "(gradient) backward step net blobs linked to rows of outer gradient tensors"),
    arg!("backward_link_external", "strings", "[]", "(gradient) the outer tensor of each backward link"),
    arg!("backward_link_offset", "ints", "[]", "(gradient) the offset of each backward link"),
    arg!("enable_rnn_executor", "int", "0", "accepted for Caffe2 compatibility (the step net runs as a plain net)"),
];

const IGNORED: &[ArgDoc] = &[
    arg!(
        "rnn_executor.num_threads",
        "int",
        "",
        "Caffe2's RNN executor setting; the step net runs as a plain net"
    ),
    arg!(
        "rnn_executor.max_cuda_streams",
        "int",
        "",
        "Caffe2's RNN executor setting (CUDA)"
    ),
];

pub fn schemas() -> Vec<OpSchema> {
    vec![
        OpSchema::new("RecurrentNetwork", build_forward)
            .inputs(1, MANY)
            .outputs(2, MANY)
            .args(RNN_ARGS)
            .ignores(IGNORED)
            .doc("Runs step_net once per timestep t = 0 .. T-1 of input 0 (T, N, ...), with the timestep blob set to t and each link's internal blob holding rows t + offset of its external tensor (copied back after the step when the step net writes it). The states are (T + k, N, D) tensors started from their initial inputs; the aliases copy rows of the states to the outputs; the last output keeps the step workspace (and, with a backward_step_net, each step's blobs) for the gradient."),
        OpSchema::new("RecurrentNetworkGradient", build_backward)
            .inputs(2, MANY)
            .outputs(1, MANY)
            .args(RNN_ARGS)
            .ignores(IGNORED)
            .doc("Gradient of RecurrentNetwork. Inputs: the gradients of the outputs_with_grads, then the forward op's inputs and outputs. Runs backward_step_net for t = T-1 .. 0 on each step's kept blobs; outputs the gradient of input 0, of each param (summed over the steps) and of each initial state."),
        OpSchema::new("RecurrentNetworkBlobFetcher", build_blob_fetcher)
            .inputs(1, 1)
            .outputs(1, 1)
            .args(&[arg!("prefix", "string", "\"rnn\"", "prefix of the copies' names")])
            .doc("Copies the blobs each timestep of a RecurrentNetwork kept (its last output, the input here) into the workspace as <prefix>_<name><t>; the output lists their names (a string tensor). Only a RecurrentNetwork with a backward_step_net keeps its steps."),
        OpSchema::new("rnn_internal_write_link", build_write_link)
            .inputs(3, 3)
            .outputs(1, 1)
            .inplace(InPlace::Enforce(|i, o| i == 2 && o == 0))
            .args(&[arg!("offset", "int", "0", "row t + offset of the external tensor")])
            .doc("Inputs (timestep, internal, external); output external (in place): rows t + offset .. of external = internal. (ferrocaffe's: RecurrentNetwork puts it after a step op whose linked output another link of the step reads, as Caffe2's shared memory did.)"),
        OpSchema::new("rnn_internal_apply_link", build_apply_link)
            .inputs(2, 2)
            .outputs(2, 2)
            .inplace(InPlace::Allow(|i, o| i == 1 && o == 1))
            .args(&[
                arg!("offset", "int", "0", "row t + offset of the external tensor"),
                arg!("window", "int", "1", "how many rows"),
            ])
            .doc("Inputs (timestep, external); outputs (internal, external): internal = a copy of rows t + offset .. t + offset + window of external (Caffe2 made a view; tensors here are values)."),
        OpSchema::new("rnn_internal_accumulate_gradient_input", build_accumulate)
            .inputs(2, 3)
            .outputs(1, 1)
            .inplace(InPlace::Allow(|i, o| i == 2 && o == 0))
            .args(&[arg!("offset", "int", "required", "row t of the input gradient is added into row t + offset")])
            .doc("Inputs (timestep, og[, g]); output g: g[t + offset] += og[t], rows along dim 0 (g is updated in place)."),
    ]
}

// ---------------------------------------------------------------- rows --

fn dim0(t: &Tensor) -> usize {
    t.shape().first().copied().unwrap_or(0)
}

/// Rows `start .. start + len` of `t` along dim 0, copied.
fn rows(t: &Tensor, start: usize, len: usize, what: &str) -> Result<Tensor> {
    if t.ndim() == 0 || start + len > dim0(t) {
        return Err(Error::shape(format!(
            "{what}: rows {start}..{} of a tensor of shape {:?} are out of range",
            start + len,
            t.shape()
        )));
    }
    Ok(crate::with_match_dtype!(tensor t, |a: T| Tensor::from(
        crate::tensor::copy_array(a.slice_axis(Axis(0), Slice::from(start..start + len)))?
    )))
}

/// Whether `src` can be written over rows `start ..` of `dst`: one dtype,
/// the same row shape, rows in range (the error otherwise).
fn fits(dst: &Tensor, start: usize, src: &Tensor, what: &str) -> Result<()> {
    if src.dtype() != dst.dtype() {
        return Err(Error::type_error(format!(
            "{what}: a {} tensor cannot be written into a {} one",
            src.dtype(),
            dst.dtype()
        )));
    }
    let (s, d) = (src.shape(), dst.shape());
    let n = s.first().copied().unwrap_or(0);
    if s.is_empty() || s.len() != d.len() || s[1..] != d[1..] || start + n > d[0] {
        return Err(Error::shape(format!(
            "{what}: a step's blob of shape {s:?} does not fit rows {start}..{} of a tensor of shape {d:?}",
            start + n,
        )));
    }
    Ok(())
}

fn write_rows_t<T: Element>(
    dst: &mut Tensor,
    start: usize,
    src: &Tensor,
    what: &str,
) -> Result<()> {
    fits(dst, start, src, what)?;
    let s = T::view(src).ok_or_else(|| Error::internal(format!("{what}: dtypes checked")))?;
    let n = s.len_of(Axis(0));
    let d = dst.array_mut::<T>()?;
    let mut rows = d.slice_axis_mut(Axis(0), Slice::from(start..start + n));
    // Row-major rows of a row-major tensor are one span: a plain copy.
    match (rows.as_slice_mut(), s.as_slice()) {
        (Some(to), Some(from)) => crate::tensor::copy_values(to, from),
        _ => rows.assign(s),
    }
    Ok(())
}

/// Writes `src` over rows `start ..` of `dst` (same dtype and row shape).
fn write_rows(dst: &mut Tensor, start: usize, src: &Tensor, what: &str) -> Result<()> {
    by_dtype!(dst.dtype(), write_rows_t(dst, start, src, what))
}

fn zero_rows_t<T: Element>(dst: &mut Tensor, start: usize, len: usize) -> Result<()> {
    let d = dst.array_mut::<T>()?;
    let end = (start + len).min(d.len_of(Axis(0)));
    d.slice_axis_mut(Axis(0), Slice::from(start.min(end)..end))
        .fill(T::default());
    Ok(())
}

/// Rows `start..start + len` of `dst` (those in range) set to zero.
fn zero_rows(dst: &mut Tensor, start: usize, len: usize) -> Result<()> {
    by_dtype!(dst.dtype(), zero_rows_t(dst, start, len))
}

fn add_span_t<T: Float>(
    dst: &mut Tensor,
    at: usize,
    src: &Tensor,
    from: usize,
    len: usize,
    what: &str,
) -> Result<()> {
    let s = T::view(src).ok_or_else(|| {
        Error::type_error(format!(
            "{what}: a {} gradient cannot be added to a {} one",
            src.dtype(),
            dst.dtype()
        ))
    })?;
    let sv = super::super::kit::dense(s);
    let d = dst.array_mut::<T>()?;
    let Some(dv) = d.as_slice_mut() else {
        return Err(Error::internal(format!(
            "{what}: a gradient is not in row-major order"
        )));
    };
    let (d, s) = (&mut dv[at..at + len], &sv[from..from + len]);
    crate::vmath::wide(
        #[inline(always)]
        || {
            for (x, &y) in d.iter_mut().zip(s) {
                *x += y;
            }
        },
    );
    Ok(())
}

/// `dst[at .. at + len] += src[from .. from + len]`, in elements (the
/// caller checked the ranges; the dtypes are checked here).
fn add_span(
    dst: &mut Tensor,
    at: usize,
    src: &Tensor,
    from: usize,
    len: usize,
    what: &str,
) -> Result<()> {
    crate::with_match_dtype!(floats dst.dtype(), |T| add_span_t::<T>(dst, at, src, from, len, what),
        else other => Err(crate::tensor::unsupported_dtype(other)))
}

/// `dst` rows `at .. at + len` += `src` rows `from .. from + len`, along
/// dim 0 (rows of one size).
fn add_rows(
    dst: &mut Tensor,
    at: usize,
    src: &Tensor,
    from: usize,
    len: usize,
    what: &str,
) -> Result<()> {
    let row = |t: &Tensor| t.shape().iter().skip(1).product::<usize>();
    let (r, ds, ss) = (row(dst), dim0(dst), dim0(src));
    if dst.ndim() == 0 || src.ndim() == 0 || r != row(src) || at + len > ds || from + len > ss {
        return Err(Error::shape(format!(
            "{what}: rows {from}..{} of a gradient of shape {:?} cannot be added to rows {at}..{} of one of shape {:?}",
            from + len,
            src.shape(),
            at + len,
            dst.shape()
        )));
    }
    add_span(dst, at * r, src, from * r, len * r, what)
}

fn timestep_tensor(t: usize) -> Tensor {
    Tensor::from(ArrayD::from_elem(IxDyn(&[1]), t as i32))
}

fn read_timestep(t: &Tensor, op: &str) -> Result<usize> {
    match super::super::kit::int_values(t)? {
        Some(v) if !v.is_empty() && v[0] >= 0 => Ok(v[0] as usize),
        _ => Err(Error::type_error(format!(
            "{op}: the timestep must be a non-negative int32 or int64 scalar, got a {} tensor of shape {:?}",
            t.dtype(),
            t.shape()
        ))),
    }
}

fn tensor_of(b: &Blob, name: &str) -> Result<Tensor> {
    b.read()
        .tensor()
        .map(|t| t.clone())
        .map_err(|e| e.with_blob(name))
}

// ----------------------------------------------------------- arguments --

#[derive(Clone, Debug)]
struct Link {
    internal: String,
    external: String,
    offset: i64,
    window: usize,
}

#[derive(Clone, Debug)]
struct Alias {
    src: String,
    dst: String,
    offset: i64,
}

fn strs(ctx: &OpDefCtx<'_>, name: &str) -> Result<Vec<String>> {
    Ok(ctx.args.string_list(name)?.unwrap_or_default())
}

fn ints(ctx: &OpDefCtx<'_>, name: &str) -> Result<Vec<i64>> {
    Ok(ctx.args.ints(name)?.unwrap_or_default())
}

fn links(ctx: &OpDefCtx<'_>, prefix: &str) -> Result<Vec<Link>> {
    let internal = strs(ctx, &format!("{prefix}link_internal"))?;
    let external = strs(ctx, &format!("{prefix}link_external"))?;
    let offset = ints(ctx, &format!("{prefix}link_offset"))?;
    let window = if prefix.is_empty() {
        ints(ctx, "link_window")?
    } else {
        Vec::new()
    };
    if external.len() != internal.len()
        || offset.len() != internal.len()
        || !(window.is_empty() || window.len() == internal.len())
    {
        return Err(ctx.bad_arg(format!(
            "{prefix}link_internal ({}), {prefix}link_external ({}), {prefix}link_offset ({}) and link_window ({}) must have one entry per link",
            internal.len(),
            external.len(),
            offset.len(),
            window.len()
        )));
    }
    let mut out = Vec::with_capacity(internal.len());
    for (k, (i, e)) in internal.into_iter().zip(external).enumerate() {
        let w = window.get(k).copied().unwrap_or(1);
        let window = usize::try_from(w)
            .ok()
            .filter(|&w| w >= 1)
            .ok_or_else(|| ctx.bad_arg(format!("link_window {w} must be at least 1")))?;
        out.push(Link {
            internal: i,
            external: e,
            offset: offset[k],
            window,
        });
    }
    Ok(out)
}

fn aliases(ctx: &OpDefCtx<'_>) -> Result<Vec<Alias>> {
    let (src, dst, off) = (
        strs(ctx, "alias_src")?,
        strs(ctx, "alias_dst")?,
        ints(ctx, "alias_offset")?,
    );
    if dst.len() != src.len() || off.len() != src.len() {
        return Err(ctx.bad_arg(format!(
            "alias_src ({}), alias_dst ({}) and alias_offset ({}) must have one entry per alias",
            src.len(),
            dst.len(),
            off.len()
        )));
    }
    Ok(src
        .into_iter()
        .zip(dst)
        .zip(off)
        .map(|((src, dst), offset)| Alias { src, dst, offset })
        .collect())
}

/// (state blob, index of its initial input).
fn states(ctx: &OpDefCtx<'_>, first_input: usize) -> Result<Vec<(String, usize)>> {
    let names = strs(ctx, "recurrent_states")?;
    let ids = ints(ctx, "initial_recurrent_state_ids")?;
    if names.len() != ids.len() {
        return Err(ctx.bad_arg(format!(
            "recurrent_states ({}) and initial_recurrent_state_ids ({}) must have one entry per state",
            names.len(),
            ids.len()
        )));
    }
    names
        .into_iter()
        .zip(ids)
        .map(|(s, i)| {
            let k = usize::try_from(i)
                .ok()
                .map(|i| i + first_input)
                .filter(|&k| k < ctx.num_inputs())
                .ok_or_else(|| {
                    ctx.bad_arg(format!("initial_recurrent_state_ids {i} is not an input"))
                })?;
            Ok((s, k))
        })
        .collect()
}

fn step_net(ctx: &OpDefCtx<'_>, name: &str) -> Result<Option<NetDef>> {
    match ctx.args.net(name) {
        Ok(n) => Ok(n),
        Err(_) if ctx.args.string_opt(name).is_ok() => Err(ctx.bad_arg(format!(
            "'{name}' is given as text; ferrocaffe takes the step net as a NetDef argument (as recurrent.recurrent_net passes it)"
        ))),
        Err(e) => Err(e),
    }
}

/// The outputs of the ops of `net`.
fn written(net: &NetDef) -> HashSet<String> {
    net.op
        .iter()
        .flat_map(|o| o.output.iter().cloned())
        .collect()
}

fn int_arg(name: &str, v: i64) -> Argument {
    Argument {
        name: Some(name.to_string()),
        i: Some(v),
        ..Argument::default()
    }
}

fn internal_op(
    ty: &str,
    input: Vec<String>,
    output: Vec<String>,
    arg: Vec<Argument>,
) -> OperatorDef {
    OperatorDef {
        r#type: Some(ty.to_string()),
        input,
        output,
        arg,
        ..OperatorDef::default()
    }
}

/// Caffe2's links were views, so an op of a step read rows that a linked
/// blob written earlier in the same step had changed (a window of past
/// inputs that includes the current one). With copies, after an op writes a
/// linked blob whose rows another link reads, the step net writes the rows
/// out (`rnn_internal_write_link`) and takes the reading link's blob again
/// (`rnn_internal_apply_link`). Steps without such overlaps are unchanged.
fn with_link_refreshes(step: &NetDef, links: &[Link], timestep: &str) -> NetDef {
    let overlaps = |w: &Link, r: &Link| {
        w.external == r.external
            && w.internal != r.internal
            && w.offset < r.offset + r.window as i64
            && r.offset < w.offset + w.window as i64
    };
    let mut out = step.clone();
    out.op.clear();
    let mut externals = Vec::new();
    for op in &step.op {
        out.op.push(op.clone());
        for o in &op.output {
            for w in links.iter().filter(|l| &l.internal == o) {
                let readers: Vec<&Link> = links.iter().filter(|r| overlaps(w, r)).collect();
                if readers.is_empty() {
                    continue;
                }
                out.op.push(internal_op(
                    "rnn_internal_write_link",
                    vec![timestep.to_string(), w.internal.clone(), w.external.clone()],
                    vec![w.external.clone()],
                    vec![int_arg("offset", w.offset)],
                ));
                for r in readers {
                    out.op.push(internal_op(
                        "rnn_internal_apply_link",
                        vec![timestep.to_string(), r.external.clone()],
                        vec![r.internal.clone(), r.external.clone()],
                        vec![
                            int_arg("offset", r.offset),
                            int_arg("window", r.window as i64),
                        ],
                    ));
                }
                externals.push(w.external.clone());
            }
        }
    }
    if !out.external_input.is_empty() {
        for name in std::iter::once(timestep.to_string()).chain(externals) {
            if !out.external_input.contains(&name) {
                out.external_input.push(name);
            }
        }
    }
    out
}

// ------------------------------------------------- the step workspace --

/// The op's step workspace and, per timestep, the values its blobs had
/// after the forward step (Caffe2's `step_workspaces` output).
#[derive(Debug)]
pub struct StepWorkspaces {
    ws: Arc<Workspace>,
    /// The forward step's blobs kept per timestep, and their names.
    kept: Mutex<Vec<Blob>>,
    names: Mutex<Vec<String>>,
    /// How many steps the last forward run kept.
    kept_steps: Mutex<usize>,
    steps: Mutex<Vec<Vec<BlobValue>>>,
}

impl BlobObject for StepWorkspaces {
    fn kind_name(&self) -> &'static str {
        "RecurrentStepWorkspaces"
    }
}

impl StepWorkspaces {
    /// The scratch in `blob` if it belongs to `parent`, else a new one
    /// stored there.
    fn of(blob: &Blob, parent: &Arc<Workspace>) -> Arc<StepWorkspaces> {
        if let Ok(s) = blob
            .read()
            .object::<StepWorkspaces>("RecurrentStepWorkspaces")
        {
            if s.ws.parent().is_some_and(|p| Arc::ptr_eq(p, parent)) {
                return s;
            }
        }
        let s = Arc::new(StepWorkspaces {
            ws: Workspace::new_child(parent),
            kept: Mutex::new(Vec::new()),
            names: Mutex::new(Vec::new()),
            kept_steps: Mutex::new(0),
            steps: Mutex::new(Vec::new()),
        });
        blob.set(BlobValue::Object(s.clone()));
        s
    }

    /// How many step workspaces there are: always one (for tests).
    pub fn workspace(&self) -> &Arc<Workspace> {
        &self.ws
    }
}

/// A link bound in the step workspace.
struct BoundLink {
    name: String,
    internal: Blob,
    external: String,
    offset: i64,
    window: usize,
    /// The step net writes the internal blob: copy it back after the step.
    written: bool,
    /// The step net's first use of the internal blob writes it (see
    /// [`overwritten_first`]): its rows are not copied in.
    fresh: bool,
    /// The external blob, looked up at its first use in a run (cleared by
    /// [`new_run`]), not at every step.
    ext: Option<Blob>,
    /// A read link whose rows at step t are those the written link at this
    /// index wrote at step t + the offset here (-1 forward, +1 backward),
    /// into an external nothing else writes: it takes that link's value
    /// (see [`forwarded_links`]) instead of copying the rows back out.
    from: Option<(usize, isize)>,
    /// A written link's last value written out, and its step (cleared by
    /// [`new_run`]).
    last: Option<(usize, Tensor)>,
    /// A fresh written link whose external holds the last run's values
    /// instead of zeros (see [`rows_covered`], [`state_rows_rewritten`],
    /// [`grad_rows_rewritten`]): a step that leaves it empty zeroes its
    /// rows instead of leaving them.
    zero_empty: bool,
    /// Its external is written only by the links and read by nothing else
    /// during the op (see [`deferred_links`]): a written link's rows go out
    /// on an idle pool thread during the next step.
    deferred: bool,
    /// A read link of such an external that no link writes: nothing
    /// changes its rows during the op, so the next step's are read ahead
    /// ([`read_ahead`]).
    constant: bool,
}

/// Forgets the external blobs `links` found in the last run (a blob the
/// workspace dropped since must not be written).
fn new_run(links: &mut [BoundLink]) {
    for l in links {
        l.ext = None;
        l.last = None;
    }
}

/// `l`'s external blob (see [`BoundLink::ext`]).
fn external(ws: &Workspace, l: &mut BoundLink) -> Result<Blob> {
    match &l.ext {
        Some(b) => Ok(b.clone()),
        None => {
            let b = ws.blob(&l.external)?;
            l.ext = Some(b.clone());
            Ok(b)
        }
    }
}

/// Binds `links` in `ws` for step net `def` (which writes `writes`).
fn bind_links(
    ws: &Arc<Workspace>,
    links: &[Link],
    writes: &HashSet<String>,
    def: &NetDef,
) -> Vec<BoundLink> {
    links
        .iter()
        .map(|l| BoundLink {
            name: l.internal.clone(),
            internal: ws.create_local_blob(&l.internal),
            external: l.external.clone(),
            offset: l.offset,
            window: l.window,
            written: writes.contains(&l.internal),
            fresh: overwritten_first(def, &l.internal),
            ext: None,
            from: None,
            last: None,
            zero_empty: false,
            deferred: false,
            constant: false,
        })
        .collect()
}

/// Marks the links whose rows may be copied out after the step has gone
/// on (`links_out`, `threads::defer`): their external is named by no op of
/// the step net `def` (nor can be: no nested nets) and touched by the op
/// between steps (`touched`) in no other way, so only the links read or
/// write it until the op ends, which waits for the copies first.
fn deferred_links(
    links: &mut [BoundLink],
    def: &NetDef,
    named: &HashSet<String>,
    touched: &HashSet<String>,
) {
    let nested = has_nested_nets(def);
    for l in links.iter_mut() {
        l.deferred = !nested && !named.contains(&l.external) && !touched.contains(&l.external);
    }
    let written: HashSet<String> = links
        .iter()
        .filter(|l| l.written)
        .map(|l| l.external.clone())
        .collect();
    for l in links.iter_mut() {
        l.constant = l.deferred && !l.written && !l.fresh && !written.contains(&l.external);
    }
}

/// Each constant link's index and its rows read ahead (or why they could
/// not be read).
type RowsRead = Arc<Mutex<Vec<(usize, Result<Tensor>)>>>;

/// The rows of step `step`'s [`BoundLink::constant`] links, read on an idle
/// pool thread while the step before runs.
struct Ahead {
    step: usize,
    rows: RowsRead,
    job: crate::threads::Deferred,
}

/// Copies of fewer bytes than this (a step's rows of all its links) are
/// made at once rather than handed to another thread: the hand-off and the
/// rows' trip between the cores' caches cost more than copying them (an
/// LSTM at batch 1: 0.78 -> 0.84 ms on one thread, 0.72 -> 0.96 on two,
/// when every step's copies were handed over; BENCHMARKS.md "Link copies
/// on the pool's idle thread").
const DEFER_MIN: usize = 16 << 10;

/// Starts reading step `step`'s rows of the constant links (None if there
/// are none, or too few bytes to hand over: [`DEFER_MIN`]).
fn read_ahead(ws: &Workspace, links: &mut [BoundLink], step: usize) -> Result<Option<Ahead>> {
    // The bytes of a step's rows, from the size of what each link read at
    // the last step.
    let bytes: usize = links
        .iter()
        .filter(|l| l.constant)
        .map(|l| match &*l.internal.read() {
            BlobValue::Tensor(t) => t.numel() * t.item_size(),
            _ => 0,
        })
        .sum();
    if bytes < DEFER_MIN {
        return Ok(None);
    }
    let mut todo = Vec::new();
    for (i, l) in links.iter_mut().enumerate() {
        if !l.constant {
            continue;
        }
        // A row out of range is left to the step's own read (its error).
        let Ok(row) = link_row(l, step) else {
            continue;
        };
        todo.push((i, external(ws, l)?, row, l.window, l.external.clone()));
    }
    if todo.is_empty() {
        return Ok(None);
    }
    let rows = Arc::new(Mutex::new(Vec::with_capacity(todo.len())));
    let out = rows.clone();
    let job = crate::threads::defer(move || {
        let got = todo
            .iter()
            .map(|(i, ext, row, window, name)| {
                let v = ext.read();
                let r = v
                    .tensor()
                    .and_then(|e| self::rows(e, *row, *window, "a link"))
                    .map_err(|e| e.with_blob(name));
                (*i, r)
            })
            .collect();
        *out.lock() = got;
        Ok(())
    });
    Ok(Some(Ahead { step, rows, job }))
}

/// Pairs each read link with the written link whose rows it reads one step
/// later (an LSTM's `hidden_t_prev` reads row t of the states, which the
/// step before wrote from `hidden_t` at offset 1): same external, same
/// window, offsets one apart, the only link writing that external, which
/// neither the step net `def` nor anything in `touched` (rows the op
/// changes between steps: an output's gradient added to a state's) writes.
/// The reading link then takes the written link's value, the rows it would
/// copy back out being exactly those (checked at each step, else copied).
fn forwarded_links(links: &mut [BoundLink], def: &NetDef, touched: &HashSet<String>) {
    let def_writes = written(def);
    for r in 0..links.len() {
        let l = &links[r];
        if l.written || l.fresh || def_writes.contains(&l.external) || touched.contains(&l.external)
        {
            continue;
        }
        let mut writers = links
            .iter()
            .enumerate()
            .filter(|(_, w)| w.written && w.external == l.external);
        let (Some((w, wl)), None) = (writers.next(), writers.next()) else {
            continue;
        };
        let delta = if wl.offset == l.offset + 1 {
            -1
        } else if l.offset == wl.offset + 1 {
            1
        } else {
            continue;
        };
        if wl.window == l.window {
            links[r].from = Some((w, delta));
        }
    }
}

/// Whether an op of `def` holds nets of its own (their ops name blobs the
/// outer op does not list).
fn has_nested_nets(def: &NetDef) -> bool {
    def.op
        .iter()
        .any(|o| o.arg.iter().any(|a| a.n.is_some() || !a.nets.is_empty()))
}

/// Whether the first op of `def` that names `blob` writes it without
/// reading it, so the rows a link would copy into it before the step are
/// never read. Not in a step net with nested nets (their ops name blobs
/// the outer op does not list).
fn overwritten_first(def: &NetDef, blob: &str) -> bool {
    let nested = has_nested_nets(def);
    let first = def
        .op
        .iter()
        .find(|o| o.input.iter().chain(&o.output).any(|n| n == blob));
    !nested
        && first.is_some_and(|o| {
            o.output.iter().any(|n| n == blob) && !o.input.iter().any(|n| n == blob)
        })
}

fn link_row(l: &BoundLink, t: usize) -> Result<usize> {
    usize::try_from(t as i64 + l.offset).map_err(|_| {
        Error::invalid_arg(format!(
            "the link of '{}' to '{}' has offset {}: row {} at timestep {t}",
            l.name,
            l.external,
            l.offset,
            t as i64 + l.offset
        ))
    })
}

/// Before a step: each link's internal blob = its rows of the external
/// (empty for a fresh link: an op writes it before any reads it).
fn links_in(
    ws: &Workspace,
    links: &mut [BoundLink],
    t: usize,
    pending: &mut Option<crate::threads::Deferred>,
    ahead: Option<Ahead>,
) -> Result<()> {
    // The constant links' rows read ahead for this step, if they were.
    let mut ready = Vec::new();
    if let Some(a) = ahead.filter(|a| a.step == t) {
        a.job.join()?;
        ready = std::mem::take(&mut *a.rows.lock());
    }
    let mut skip = Vec::new();
    for (i, r) in ready {
        links[i].internal.set(BlobValue::Tensor(r?));
        skip.push(i);
    }
    for i in 0..links.len() {
        if skip.contains(&i) {
            continue;
        }
        let forwarded = links[i].from.and_then(|(w, delta)| {
            let (tw, v) = links[w].last.as_ref()?;
            (*tw as isize == t as isize + delta && v.shape().first() == Some(&links[i].window))
                .then(|| v.clone())
        });
        let l = &mut links[i];
        if l.fresh {
            link_row(l, t)?;
            l.internal.set(BlobValue::Empty);
            continue;
        }
        let row = link_row(l, t)?;
        if let Some(v) = forwarded {
            l.internal.set(BlobValue::Tensor(v));
            continue;
        }
        if l.deferred {
            // Rows the last step's links may still be writing.
            if let Some(p) = pending.take() {
                p.join()?;
            }
        }
        let rows = {
            let ext = external(ws, l)?;
            let v = ext.read();
            let e = v.tensor().map_err(|e| e.with_blob(&l.external))?;
            rows(e, row, l.window, "a link").map_err(|e| e.with_blob(&l.external))?
        };
        l.internal.set(BlobValue::Tensor(rows));
    }
    Ok(())
}

/// After a step: the links the step wrote go back into their externals (a
/// fresh link left empty was not written: its rows stay). Those of
/// [`BoundLink::deferred`] externals are copied by the returned job, on an
/// idle pool thread while the next step runs (in link order; the caller
/// joins it before the links next touch those externals).
fn links_out(
    ws: &Workspace,
    links: &mut [BoundLink],
    t: usize,
) -> Result<Option<crate::threads::Deferred>> {
    // Enough bytes to hand over ([`DEFER_MIN`])?
    let bytes: usize = links
        .iter()
        .filter(|l| l.written && l.deferred)
        .map(|l| match &*l.internal.read() {
            BlobValue::Tensor(t) => t.numel() * t.item_size(),
            _ => 0,
        })
        .sum();
    let deferring = bytes >= DEFER_MIN;
    let mut later: Vec<(Blob, Option<Tensor>, usize, usize, String)> = Vec::new();
    for l in links.iter_mut().filter(|l| l.written) {
        let v = l.internal.get();
        if l.fresh && v.is_empty() {
            if l.zero_empty {
                let row = link_row(l, t)?;
                let ext = external(ws, l)?;
                if l.deferred && deferring {
                    later.push((ext, None, row, l.window, l.external.clone()));
                } else {
                    write_out(&ext, None, row, l.window, &l.external)?;
                }
            }
            continue;
        }
        let row = link_row(l, t)?;
        let src = v.tensor().map_err(|e| e.with_blob(&l.external))?.clone();
        let ext = external(ws, l)?;
        l.last = Some((t, src.clone()));
        if l.deferred && deferring {
            // Checked now, so a step that writes rows of the wrong shape
            // fails here, before the next step reads them (forwarded).
            if let BlobValue::Tensor(dst) = &*ext.read() {
                fits(dst, row, &src, "a link").map_err(|e| e.with_blob(&l.external))?;
            }
            later.push((ext, Some(src), row, l.window, l.external.clone()));
        } else {
            write_out(&ext, Some(&src), row, l.window, &l.external)?;
        }
    }
    if later.is_empty() {
        return Ok(None);
    }
    Ok(Some(crate::threads::defer(move || {
        for (ext, src, row, window, name) in &later {
            write_out(ext, src.as_ref(), *row, *window, name)?;
        }
        Ok(())
    })))
}

/// Writes `src` over rows `row ..` of the tensor in `ext` (named `name`),
/// or zeros over `window` rows from `row` when `src` is `None`.
fn write_out(
    ext: &Blob,
    src: Option<&Tensor>,
    row: usize,
    window: usize,
    name: &str,
) -> Result<()> {
    let mut w = ext.write();
    let BlobValue::Tensor(dst) = &mut *w else {
        return Err(Error::type_error("a link's external blob holds no tensor").with_blob(name));
    };
    match src {
        Some(src) => write_rows(dst, row, src, "a link"),
        None => zero_rows(dst, row, window),
    }
    .map_err(|e| e.with_blob(name))
}

// ------------------------------------------------------------- forward --

struct ForwardOp {
    step: NetDef,
    links: Vec<Link>,
    aliases: Vec<Alias>,
    states: Vec<(String, usize)>,
    timestep: String,
    /// A backward step net exists: keep each step's blobs.
    keep: bool,
    recompute: HashSet<String>,
    allow_unknown_args: bool,
    bound: Option<ForwardBound>,
}

struct ForwardBound {
    scratch: Arc<StepWorkspaces>,
    net: Net,
    timestep: Blob,
    links: Vec<BoundLink>,
    /// Every blob an op of the step net names.
    named: HashSet<String>,
}

fn build_forward(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let step = step_net(ctx, "step_net")?
        .ok_or_else(|| ctx.bad_arg("RecurrentNetwork needs a 'step_net' argument"))?;
    let keep = ctx.args.net("backward_step_net").ok().flatten().is_some()
        || ctx
            .args
            .string_opt("backward_step_net")
            .ok()
            .flatten()
            .is_some_and(|s| !s.is_empty());
    Ok(Box::new(ForwardOp {
        step,
        links: links(ctx, "")?,
        aliases: aliases(ctx)?,
        states: states(ctx, 0)?,
        timestep: ctx.args.string("timestep", "timestep")?,
        keep,
        recompute: strs(ctx, "recompute_blobs_on_backward")?
            .into_iter()
            .collect(),
        allow_unknown_args: ctx.allow_unknown_args,
        bound: None,
    }))
}

/// The (T + k, N, D) state started from its initial input.
/// The states tensor of a run: the initial state in its first rows, then
/// zeros, or whatever `reuse` (the last run's tensor, used when it has the
/// dtype and shape) holds there (see [`state_rows_rewritten`]).
fn initial_state(
    init: &Tensor,
    steps: usize,
    batch: usize,
    name: &str,
    reuse: Option<Tensor>,
) -> Result<Tensor> {
    let s = init.shape();
    if s.is_empty() || s.len() > 3 {
        return Err(Error::shape(format!(
            "RecurrentNetwork: the initial state '{name}' must have 1 to 3 dims, got shape {s:?}"
        ))
        .with_blob(name));
    }
    let d = s[s.len() - 1];
    let k = if s.len() == 3 { s[0] } else { 1 };
    if s.len() >= 2 && s[s.len() - 2] != batch {
        return Err(Error::shape(format!(
            "RecurrentNetwork: the initial state '{name}' (shape {s:?}) must have the batch size {batch} before its last dim"
        ))
        .with_blob(name));
    }
    let shape = [steps + k, batch, d];
    let mut state = match reuse {
        Some(t) if t.dtype() == init.dtype() && t.shape() == shape => t,
        _ => Tensor::zeros(init.dtype(), &shape)?,
    };
    if s.len() >= 2 {
        let first = init.clone().into_shape(&[k, batch, d])?;
        write_rows(&mut state, 0, &first, "an initial state")?;
    } else {
        let row = init.clone().into_shape(&[1, 1, d])?;
        let row = crate::with_match_dtype!(tensor & row, |a: T| Tensor::from(
            a.broadcast(IxDyn(&[1, batch, d]))
                .ok_or_else(|| Error::internal("broadcasting an initial state"))
                .and_then(|v| crate::tensor::copy_array(v))?
        ));
        write_rows(&mut state, 0, &row, "an initial state")?;
    }
    Ok(state)
}

impl ForwardOp {
    fn bind(&mut self, cx: &OpCx<'_>) -> Result<()> {
        let scratch_blob = cx.output_blob(cx.num_outputs() - 1);
        let scratch = StepWorkspaces::of(scratch_blob, cx.ws);
        if self
            .bound
            .as_ref()
            .is_some_and(|b| Arc::ptr_eq(&b.scratch, &scratch))
        {
            return Ok(());
        }
        let ws = &scratch.ws;
        let timestep = ws.create_local_blob(&self.timestep);
        let writes = written(&self.step);
        let def = with_link_refreshes(&self.step, &self.links, &self.timestep);
        let mut links = bind_links(ws, &self.links, &writes, &def);
        forwarded_links(&mut links, &def, &HashSet::new());
        let named = named_blobs(&def);
        deferred_links(&mut links, &def, &named, &HashSet::new());
        let net = Net::create_with(&def, ws, self.allow_unknown_args)?;
        // What the backward step reads of step t: the step's own blobs
        // (not the parameters it writes in the outer workspace), but not
        // those it computes again.
        let mut kept = Vec::new();
        let mut names = Vec::new();
        let mut seen = HashSet::new();
        for name in self
            .links
            .iter()
            .map(|l| &l.internal)
            .chain(self.step.op.iter().flat_map(|o| o.output.iter()))
        {
            if ws.has_local_blob(name)
                && !self.recompute.contains(name)
                && seen.insert(name.clone())
            {
                kept.push(ws.blob(name)?);
                names.push(name.clone());
            }
        }
        *scratch.kept.lock() = kept;
        *scratch.names.lock() = names;
        self.bound = Some(ForwardBound {
            scratch,
            net,
            timestep,
            links,
            named,
        });
        Ok(())
    }
}

impl Operator for ForwardOp {
    fn run(&mut self, cx: &mut OpCx<'_>) -> Result<bool> {
        let input0 = tensor_of(cx.input_blob(0), &cx.io.input_names[0])?;
        if input0.ndim() < 2 {
            return Err(Error::shape(format!(
                "RecurrentNetwork: input 0 must be (T, N, ...), got shape {:?}",
                input0.shape()
            ))
            .with_blob(&cx.io.input_names[0]));
        }
        let (steps, batch) = (input0.shape()[0], input0.shape()[1]);
        drop(input0);
        // The states start from their initial rows; the rest are zeros, or
        // the last run's tensor where the links write every row again (taken
        // out of its blob until then, so that nothing else holds it).
        let mut olds = Vec::with_capacity(self.states.len());
        for (state, _) in &self.states {
            let blob = cx.ws.create_blob(state);
            let old = match taken(&blob, state, &cx.io.input_names) {
                BlobValue::Tensor(t) => Some(t),
                _ => None,
            };
            olds.push((blob, old));
        }
        self.bind(cx)?;
        let b = self.bound.as_mut().expect("bound");
        let mut reused = HashSet::new();
        for ((state, i), (blob, old)) in self.states.iter().zip(olds) {
            let init = tensor_of(cx.input_blob(*i), &cx.io.input_names[*i])?;
            let k = if init.ndim() == 3 { init.shape()[0] } else { 1 };
            let old = old
                .filter(|_| !b.named.contains(state) && state_rows_rewritten(&b.links, state, k));
            if old.is_some() {
                reused.insert(state.clone());
            }
            let s = initial_state(&init, steps, batch, &cx.io.input_names[*i], old)?;
            blob.set(BlobValue::Tensor(s));
        }
        for l in &mut b.links {
            l.zero_empty = l.fresh && reused.contains(&l.external);
        }
        let ws = b.scratch.ws.clone();
        let kept = b.scratch.kept.lock().clone();
        new_run(&mut b.links);
        let mut slots = b.scratch.steps.lock();
        if self.keep && slots.len() < steps {
            slots.resize_with(steps, Vec::new);
        }
        // The step net's FC lays its weights out once for all the steps.
        let finished = crate::ops::matmul::with_plain_weights(|| -> Result<bool> {
            // The last step's rows still going out (joined on every way out:
            // a drop waits for it too).
            let mut pending = None;
            // The next step's constant rows, being read.
            let mut ahead = None;
            for t in 0..steps {
                cx.cancel.poll_check()?;
                links_in(&ws, &mut b.links, t, &mut pending, ahead.take())?;
                if t + 1 < steps {
                    ahead = read_ahead(&ws, &mut b.links, t + 1)?;
                }
                b.timestep.set(BlobValue::Tensor(timestep_tensor(t)));
                if !b.net.run(&ws, cx.cancel)? {
                    return Ok(false);
                }
                if let Some(p) = pending.take() {
                    p.join()?;
                }
                pending = links_out(&ws, &mut b.links, t)?;
                if self.keep {
                    let slot = &mut slots[t];
                    slot.clear();
                    slot.extend(kept.iter().map(|k| k.get()));
                }
            }
            if let Some(p) = pending.take() {
                p.join()?;
            }
            Ok(true)
        })?;
        if !finished {
            return Ok(false);
        }
        drop(slots);
        *b.scratch.kept_steps.lock() = if self.keep { steps } else { 0 };
        for a in &self.aliases {
            let src = tensor_of(&cx.ws.blob(&a.src)?, &a.src)?;
            let n = dim0(&src) as i64;
            let start = if a.offset >= 0 {
                a.offset
            } else {
                n + a.offset
            };
            if start < 0 || start >= n {
                return Err(Error::invalid_arg(format!(
                    "RecurrentNetwork: alias offset {} leaves no row of '{}' ({} rows) for '{}'",
                    a.offset, a.src, n, a.dst
                )));
            }
            let v = rows(&src, start as usize, (n - start) as usize, "an alias")?;
            cx.ws.create_blob(&a.dst).set(BlobValue::Tensor(v));
        }
        Ok(true)
    }
}

// ------------------------------------------------------------ backward --

struct Param {
    /// The forward input (outer name).
    param: String,
    /// Its gradient (an output of the op, in the outer workspace).
    grad: String,
    /// The backward step net's gradient of one step, summed into `grad`.
    step_grad: String,
}

struct StateGrad {
    state: String,
    grad: String,
    /// The input of the op holding the gradient of the state's rows 1..
    /// (an alias with offset 1), if it has one.
    all: Option<usize>,
    /// The input holding the gradient of the last row (offset -1).
    last: Option<usize>,
    /// The forward input holding the initial state.
    init: usize,
}

struct BackwardOp {
    step: NetDef,
    links: Vec<Link>,
    params: Vec<Param>,
    states: Vec<StateGrad>,
    timestep: String,
    n_go: usize,
    allow_unknown_args: bool,
    bound: Option<BackwardBound>,
}

struct BackwardBound {
    scratch: Arc<StepWorkspaces>,
    net: Net,
    timestep: Blob,
    links: Vec<BoundLink>,
    step_grads: Vec<Blob>,
    gathered: Vec<Gathered>,
    /// Every blob an op of the step net names.
    named: HashSet<String>,
}

/// A backward step net's FCGradient whose weight and bias gradients are
/// made once over the sequence: the step net makes its dX alone, and after
/// each step its X and dY rows are kept (the op's inputs hold after the
/// step what they held when it ran: no later op of the step writes them).
struct Gathered {
    /// X, W and dY.
    inputs: [String; 3],
    /// The parameters (indices into `BackwardOp::params`) whose step
    /// gradients are the op's outputs 0 (dW) and 1 (db); `None`: an output
    /// nothing reads, not made.
    to: [Option<usize>; 2],
    rows: FcGradSteps,
    /// X, W and dY's blobs, looked up at the first step of a run (cleared
    /// when a run starts, as [`BoundLink::ext`]), not at every step.
    blobs: Option<[Blob; 3]>,
    /// The written link (an index into `BackwardBound::links`) that copies
    /// dY out after each step into rows nothing else writes (see
    /// [`dy_links`]): dY's rows are read there at the end, not kept.
    dy_link: Option<usize>,
}

/// The value of `blob` (named `name`, an output the op may reuse), taken
/// out of it so that nothing else holds it; `Empty` and left in place when
/// the blob is also one of the op's `inputs`.
fn taken(blob: &Blob, name: &str, inputs: &[String]) -> BlobValue {
    if inputs.iter().any(|i| i == name) {
        BlobValue::Empty
    } else {
        std::mem::replace(&mut *blob.write(), BlobValue::Empty)
    }
}

/// Every blob an op of `def` names.
fn named_blobs(def: &NetDef) -> HashSet<String> {
    def.op
        .iter()
        .flat_map(|o| o.input.iter().chain(&o.output))
        .cloned()
        .collect()
}

/// Whether the forward links write every row of a states tensor `external`
/// after its `k` initial rows before any link reads it: one written link,
/// window 1 at offset `k` (step t writes row t + k), and links that read at
/// step t only rows below t + k.
fn state_rows_rewritten(links: &[BoundLink], external: &str, k: usize) -> bool {
    let mut writers = 0;
    for l in links.iter().filter(|l| l.external == external) {
        if l.written {
            if l.window != 1 || l.offset != k as i64 {
                return false;
            }
            writers += 1;
        } else if l.offset < 0 || l.offset as usize + l.window > k {
            return false;
        }
    }
    writers == 1
}

/// Whether the backward links write each row of a state's gradient
/// `external` below the sequence's length before any link reads it: one
/// written link, window 1 at offset 0 (step t writes row t), and links that
/// read at step t only rows above t (written at a later step, which runs
/// before it, or past the sequence, zeroed).
fn grad_rows_rewritten(links: &[BoundLink], external: &str) -> bool {
    let mut writers = 0;
    for l in links.iter().filter(|l| l.external == external) {
        if l.written {
            if l.window != 1 || l.offset != 0 {
                return false;
            }
            writers += 1;
        } else if l.offset < 1 {
            return false;
        }
    }
    writers == 1
}

/// Whether the written links to `external` write each of its `rows` rows
/// over `steps` steps, and no link reads it.
fn rows_covered(links: &[BoundLink], external: &str, steps: usize, rows: usize) -> bool {
    let mut hit = vec![false; rows];
    for l in links.iter().filter(|l| l.external == external) {
        if !l.written {
            return false;
        }
        for t in 0..steps {
            let first = t as i64 + l.offset;
            for r in first..first + l.window as i64 {
                match usize::try_from(r).ok().and_then(|r| hit.get_mut(r)) {
                    Some(h) => *h = true,
                    None => return false,
                }
            }
        }
    }
    hit.iter().all(|&h| h)
}

/// Finds, for each of `gathered`, a written link of its dY whose rows the
/// product can read after the last step: window 1, the only link writing
/// its external, which neither the step net `def` names nor the op
/// touches between steps (`touched`), so step t's dY stays in row t +
/// offset.
fn dy_links(
    gathered: &mut [Gathered],
    links: &[BoundLink],
    named: &HashSet<String>,
    touched: &HashSet<String>,
) {
    for g in gathered {
        g.dy_link = links.iter().position(|l| {
            l.written
                && l.name == g.inputs[2]
                && l.window == 1
                && l.offset >= 0
                && !named.contains(&l.external)
                && !touched.contains(&l.external)
                && links
                    .iter()
                    .filter(|o| o.written && o.external == l.external)
                    .count()
                    == 1
        });
    }
}

/// Takes each FCGradient of `step` that makes parameters' step gradients
/// and can be gathered (see [`Gathered`]) out of the per-step sums: the op
/// is replaced by `rnn_internal_fc_input_gradient` (or dropped when it
/// makes no dX). The op's outputs 0 and 1 must be parameters' step
/// gradients or blobs no other op and no link touches, and its inputs must
/// be written by no later op nor be its own outputs.
fn gather_fc_grads(step: &mut NetDef, params: &[Param], links: &[Link]) -> Result<Vec<Gathered>> {
    let param_of = |name: &str| params.iter().position(|p| p.step_grad == name);
    let mut found = Vec::new();
    let mut i = 0;
    while i < step.op.len() {
        let op = &step.op[i];
        let ty = op.r#type.as_deref().unwrap_or("");
        let gatherable = matches!(ty, "FCGradient" | "FCTransposedGradient")
            && op.input.len() == 3
            && (2..=3).contains(&op.output.len())
            && op.output[0] != op.output[1]
            && !op.output.iter().any(|o| op.input.contains(o));
        let to = if gatherable {
            [param_of(&op.output[0]), param_of(&op.output[1])]
        } else {
            [None, None]
        };
        if to == [None, None] {
            i += 1;
            continue;
        }
        let params_out = &op.output[..2];
        let touched_elsewhere = step.op.iter().enumerate().any(|(j, o)| {
            j != i
                && o.input
                    .iter()
                    .chain(&o.output)
                    .any(|n| params_out.contains(n))
        }) || links.iter().any(|l| params_out.contains(&l.internal));
        let inputs_rewritten = step.op[i + 1..]
            .iter()
            .any(|o| o.output.iter().any(|n| op.input.contains(n)));
        if touched_elsewhere || inputs_rewritten {
            i += 1;
            continue;
        }
        let rows = FcGradSteps::new(op)?;
        let inputs = [
            op.input[0].clone(),
            op.input[1].clone(),
            op.input[2].clone(),
        ];
        match op.output.get(2).cloned() {
            Some(dx) => {
                step.op[i] = rows.input_gradient_op(op, dx);
                i += 1;
            }
            None => {
                step.op.remove(i);
            }
        }
        found.push(Gathered {
            inputs,
            to,
            rows,
            blobs: None,
            dy_link: None,
        });
    }
    Ok(found)
}

fn build_backward(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let ts = ctx.args.string("timestep", "timestep")?;
    let mut step = step_net(ctx, "backward_step_net")?.ok_or_else(|| {
        ctx.bad_arg("RecurrentNetworkGradient needs a 'backward_step_net' argument")
    })?;
    let with_grads: Vec<i64> = ctx
        .args
        .ints("outputs_with_grads")?
        .unwrap_or_else(|| vec![0]);
    let n_go = with_grads.len();
    if n_go == 0 || n_go >= ctx.num_inputs() {
        return Err(ctx.bad_arg(
            "outputs_with_grads must name at least one output, whose gradient is an input",
        ));
    }
    let param_ids = ints(ctx, "param")?;
    let param_grads = strs(ctx, "param_grads")?;
    if !param_grads.is_empty() && param_grads.len() != param_ids.len() {
        return Err(ctx.bad_arg(format!(
            "param ({}) and param_grads ({}) must have one entry per parameter",
            param_ids.len(),
            param_grads.len()
        )));
    }
    let mut params = Vec::new();
    for (i, &p) in param_ids.iter().enumerate() {
        let input = usize::try_from(p)
            .ok()
            .map(|p| p + n_go)
            .filter(|&k| k < ctx.num_inputs())
            .ok_or_else(|| ctx.bad_arg(format!("param {p} is not an input")))?;
        let grad = ctx
            .def
            .output
            .get(i + 1)
            .cloned()
            .ok_or_else(|| ctx.bad_arg(format!("param {p} has no gradient output")))?;
        let in_step = param_grads.get(i).cloned().unwrap_or_else(|| grad.clone());
        let step_grad = format!("{in_step}_tmpstep");
        // The step net writes one step's gradient; the op sums them.
        for o in &mut step.op {
            for n in o.input.iter_mut().chain(o.output.iter_mut()) {
                if *n == in_step {
                    *n = step_grad.clone();
                }
            }
        }
        params.push(Param {
            param: ctx.def.input[input].clone(),
            grad,
            step_grad,
        });
    }
    let alias = aliases(ctx)?;
    let mut states_out = Vec::new();
    for (k, (state, init)) in states(ctx, n_go)?.into_iter().enumerate() {
        let mut sg = StateGrad {
            grad: format!("{state}_grad"),
            state,
            all: None,
            last: None,
            init,
        };
        for (j, a) in alias.iter().enumerate() {
            if a.src != sg.state {
                continue;
            }
            let Some(pos) = with_grads.iter().position(|&w| w == j as i64) else {
                continue;
            };
            match a.offset {
                1 => sg.all = Some(pos),
                -1 => sg.last = Some(pos),
                o => {
                    return Err(ctx.bad_arg(format!(
                        "the gradient of alias '{}' of '{}' needs offset 1 or -1, got {o}",
                        a.dst, a.src
                    )))
                }
            }
        }
        if ctx.def.output.len() <= 1 + params.len() + k {
            return Err(ctx.bad_arg(format!("initial state {k} has no gradient output")));
        }
        states_out.push(sg);
    }
    // The backward step reads the timestep (Caffe2 declares it).
    if !step.external_input.is_empty() && !step.external_input.contains(&ts) {
        step.external_input.push(ts.clone());
    }
    let mut all_links = links(ctx, "")?;
    all_links.extend(links(ctx, "backward_")?);
    Ok(Box::new(BackwardOp {
        step,
        links: all_links,
        params,
        states: states_out,
        timestep: ts,
        n_go,
        allow_unknown_args: ctx.allow_unknown_args,
        bound: None,
    }))
}

impl BackwardOp {
    fn bind(&mut self, cx: &OpCx<'_>) -> Result<()> {
        let last = cx.num_inputs() - 1;
        let scratch = cx
            .input_blob(last)
            .read()
            .object::<StepWorkspaces>("RecurrentStepWorkspaces")
            .map_err(|e| e.with_blob(&cx.io.input_names[last]))?;
        if self
            .bound
            .as_ref()
            .is_some_and(|b| Arc::ptr_eq(&b.scratch, &scratch))
        {
            return Ok(());
        }
        let ws = &scratch.ws;
        let timestep = ws.create_local_blob(&self.timestep);
        let writes = written(&self.step);
        let mut def = with_link_refreshes(&self.step, &self.links, &self.timestep);
        let mut gathered = gather_fc_grads(&mut def, &self.params, &self.links)?;
        // The forward links were kept with each step; only the gradients'
        // are applied.
        let mut links: Vec<BoundLink> = bind_links(ws, &self.links, &writes, &def)
            .into_iter()
            .filter(|l| {
                l.written
                    || !scratch
                        .kept
                        .lock()
                        .iter()
                        .any(|k| Arc::ptr_eq(k, &l.internal))
            })
            .collect();
        // The outer gradients of the states' outputs are added to their
        // gradients' rows between steps.
        let touched: HashSet<String> = self
            .states
            .iter()
            .filter(|s| s.all.is_some() || s.last.is_some())
            .map(|s| s.grad.clone())
            .collect();
        forwarded_links(&mut links, &def, &touched);
        let named = named_blobs(&def);
        deferred_links(&mut links, &def, &named, &touched);
        dy_links(&mut gathered, &links, &named, &touched);
        let step_grads = self
            .params
            .iter()
            .map(|p| ws.create_local_blob(&p.step_grad))
            .collect();
        let net = Net::create_with(&def, ws, self.allow_unknown_args)?;
        self.bound = Some(BackwardBound {
            scratch,
            net,
            timestep,
            links,
            step_grads,
            gathered,
            named,
        });
        Ok(())
    }
}

impl Operator for BackwardOp {
    fn run(&mut self, cx: &mut OpCx<'_>) -> Result<bool> {
        let seq_name = cx.io.input_names[self.n_go].clone();
        let seq = tensor_of(cx.input_blob(self.n_go), &seq_name)?;
        if seq.ndim() < 2 {
            return Err(Error::shape(format!(
                "RecurrentNetworkGradient: the sequence must be (T, N, ...), got shape {:?}",
                seq.shape()
            ))
            .with_blob(&seq_name));
        }
        let steps = seq.shape()[0];
        // Gradients start at zero: the parameters', the sequence's and the
        // states' (with the last row's outer gradient added).
        for p in &self.params {
            let v = tensor_of(&cx.ws.blob(&p.param)?, &p.param)?;
            cx.ws
                .create_blob(&p.grad)
                .set(BlobValue::Tensor(Tensor::zeros(v.dtype(), v.shape())?));
        }
        // The sequence's gradient: zeros, or the last run's tensor when the
        // links overwrite all its rows (see `rows_covered`); taken out of
        // its blob until bound, so that nothing else holds it.
        let seq_grad = format!("{seq_name}_grad");
        let seq_blob = cx.ws.create_blob(&seq_grad);
        let old = taken(&seq_blob, &seq_grad, &cx.io.input_names);
        // The states' gradients likewise (taken out of their blobs until
        // bound): zeros, or the last run's tensors where the links write
        // each row before it is read, the rows past the sequence zeroed.
        let mut outer_grads = Vec::with_capacity(self.states.len());
        let mut olds = Vec::with_capacity(self.states.len());
        for s in &self.states {
            let blob = cx.ws.create_blob(&s.grad);
            let old = if s.grad == seq_grad {
                BlobValue::Empty
            } else {
                taken(&blob, &s.grad, &cx.io.input_names)
            };
            olds.push(old);
            let all = match s.all {
                Some(k) => Some(tensor_of(cx.input_blob(k), &cx.io.input_names[k])?),
                None => None,
            };
            outer_grads.push((blob, all));
        }
        // Bound now that the gradients it may link exist.
        self.bind(cx)?;
        let b = self.bound.as_mut().expect("bound");
        let mut reused = HashSet::new();
        let seq_old = match old {
            BlobValue::Tensor(t)
                if t.dtype() == seq.dtype()
                    && t.shape() == seq.shape()
                    && !b.named.contains(&seq_grad)
                    && !self.states.iter().any(|s| s.grad == seq_grad)
                    && rows_covered(&b.links, &seq_grad, steps, steps) =>
            {
                reused.insert(seq_grad.clone());
                Some(t)
            }
            _ => None,
        };
        let g = match seq_old {
            Some(t) => t,
            None => Tensor::zeros(seq.dtype(), seq.shape())?,
        };
        seq_blob.set(BlobValue::Tensor(g));
        for ((s, (blob, _)), old) in self.states.iter().zip(&outer_grads).zip(olds) {
            let st = tensor_of(&cx.ws.blob(&s.state)?, &s.state)?;
            let n = dim0(&st);
            let mut g = match old {
                BlobValue::Tensor(mut t)
                    if t.dtype() == st.dtype()
                        && t.shape() == st.shape()
                        && n > steps
                        && !b.named.contains(&s.grad)
                        && grad_rows_rewritten(&b.links, &s.grad) =>
                {
                    zero_rows(&mut t, steps, n - steps)?;
                    reused.insert(s.grad.clone());
                    t
                }
                _ => Tensor::zeros(st.dtype(), st.shape())?,
            };
            drop(st);
            if let Some(k) = s.last {
                let og = tensor_of(cx.input_blob(k), &cx.io.input_names[k])?;
                add_rows(&mut g, n - 1, &og, 0, 1, "the last state's gradient")
                    .map_err(|e| e.with_blob(&cx.io.input_names[k]))?;
            }
            blob.set(BlobValue::Tensor(g));
        }
        for l in &mut b.links {
            l.zero_empty = l.fresh && reused.contains(&l.external);
        }
        let ws = b.scratch.ws.clone();
        let kept_steps = *b.scratch.kept_steps.lock();
        if kept_steps < steps {
            return Err(Error::invalid_arg(format!(
                "RecurrentNetworkGradient: the forward op kept {kept_steps} steps, the sequence has {steps} (did it run with a backward_step_net?)"
            )));
        }
        let kept = b.scratch.kept.lock().clone();
        new_run(&mut b.links);
        for g in &mut b.gathered {
            g.rows.clear();
            g.blobs = None;
        }
        // The last step's rows still going out (see the forward's loop).
        let mut pending = None;
        let mut ahead = None;
        for t in (0..steps).rev() {
            cx.cancel.poll_check()?;
            {
                let slots = b.scratch.steps.lock();
                for (blob, v) in kept.iter().zip(&slots[t]) {
                    blob.set(v.clone());
                }
            }
            // The outer gradient of the output at t joins the state's
            // gradient at row t + 1.
            for (g, all) in &outer_grads {
                if let Some(og) = all {
                    let mut w = g.write();
                    let BlobValue::Tensor(gt) = &mut *w else {
                        return Err(Error::internal("a state gradient holds no tensor"));
                    };
                    add_rows(gt, t + 1, og, t, 1, "an output's gradient")?;
                }
            }
            b.timestep.set(BlobValue::Tensor(timestep_tensor(t)));
            links_in(&ws, &mut b.links, t, &mut pending, ahead.take())?;
            if t > 0 {
                ahead = read_ahead(&ws, &mut b.links, t - 1)?;
            }
            if !b.net.run(&ws, cx.cancel)? {
                return Ok(false);
            }
            if let Some(p) = pending.take() {
                p.join()?;
            }
            pending = links_out(&ws, &mut b.links, t)?;
            for g in &mut b.gathered {
                if g.blobs.is_none() {
                    let [x, w, dy] = g.inputs.each_ref().map(|n| ws.blob(n));
                    g.blobs = Some([x?, w?, dy?]);
                }
                let blobs = g.blobs.as_ref().expect("set above");
                let [x, w, dy] = [0, 1, 2].map(|i| tensor_of(&blobs[i], &g.inputs[i]));
                let names = g.inputs.each_ref().map(String::as_str);
                g.rows
                    .push(&x?, &w?, &dy?, names, steps, g.dy_link.map(|_| t))?;
            }
            for (k, (p, sg)) in self.params.iter().zip(&b.step_grads).enumerate() {
                if b.gathered.iter().any(|g| g.to.contains(&Some(k))) {
                    continue;
                }
                let v = sg.get();
                let one = v.tensor().map_err(|e| e.with_blob(&p.step_grad))?;
                add_param_grad(cx.ws, p, one)?;
            }
        }
        if let Some(p) = pending.take() {
            p.join()?;
        }
        for g in &mut b.gathered {
            let sums = match g.dy_link {
                Some(k) => {
                    let l = &mut b.links[k];
                    let ext = external(&ws, l)?;
                    let v = ext.read();
                    let t = v.tensor().map_err(|e| e.with_blob(&l.external))?;
                    g.rows.take(Some((t, l.offset as usize)))?
                }
                None => g.rows.take(None)?,
            };
            if let Some((dw, db)) = sums {
                for (to, sum) in g.to.iter().zip([dw, db]) {
                    if let Some(p) = to.map(|k| &self.params[k]) {
                        add_param_grad(cx.ws, p, &sum)?;
                    }
                }
            }
        }
        // Output 0 is the sequence's gradient (written by the backward links).
        let out0 = cx.io.output_names[0].clone();
        if out0 != seq_grad {
            let v = cx.ws.blob(&seq_grad)?.get();
            cx.output_blob(0).set(v);
        }
        for (i, s) in self.states.iter().enumerate() {
            let out = 1 + self.params.len() + i;
            let init = tensor_of(cx.input_blob(s.init), &cx.io.input_names[s.init])?;
            let g = tensor_of(&cx.ws.blob(&s.grad)?, &s.grad)?;
            let value = if init.ndim() >= 2 {
                let k = if init.ndim() == 3 { init.shape()[0] } else { 1 };
                rows(&g, 0, k, "an initial state's gradient")?.into_shape(init.shape())?
            } else {
                sum_batch(&g, init.shape())?
            };
            cx.output_blob(out).set(BlobValue::Tensor(value));
        }
        Ok(true)
    }
}

/// Adds `one` (a step's gradient of parameter `p`, or its sum over the
/// steps) into the parameter's gradient.
fn add_param_grad(ws: &Workspace, p: &Param, one: &Tensor) -> Result<()> {
    let g = ws.blob(&p.grad)?;
    let mut w = g.write();
    let BlobValue::Tensor(gt) = &mut *w else {
        return Err(Error::internal("a parameter gradient holds no tensor"));
    };
    let n = one.numel();
    if gt.numel() != n {
        return Err(Error::shape(format!(
            "RecurrentNetworkGradient: the step gradient '{}' has shape {:?}, the parameter '{}' {:?}",
            p.step_grad,
            one.shape(),
            p.param,
            gt.shape()
        )));
    }
    add_span(gt, 0, one, 0, n, "a parameter's gradient")
}

fn sum_batch_t<T: Float>(g: &Tensor, shape: &[usize]) -> Result<Tensor> {
    let a = T::view(g).ok_or_else(|| Error::internal("a state gradient of another dtype"))?;
    let d: usize = shape.iter().product();
    let v = super::super::kit::dense(a);
    let batch = if d == 0 {
        0
    } else {
        a.shape().get(1).copied().unwrap_or(0)
    };
    let mut out = crate::tensor::zeroed_vec::<T>(shape, "an initial state's gradient")?;
    for r in 0..batch {
        for (o, &x) in out.iter_mut().zip(&v[r * d..(r + 1) * d]) {
            *o += x;
        }
    }
    Ok(T::wrap(super::super::kit::array(shape, out)?))
}

/// The gradient of a 1-D initial state repeated over the batch: row 0 of
/// the state's gradient summed over the batch.
fn sum_batch(g: &Tensor, shape: &[usize]) -> Result<Tensor> {
    crate::with_match_dtype!(floats g.dtype(), |T| sum_batch_t::<T>(g, shape),
        else other => Err(crate::tensor::unsupported_dtype(other)))
}

// ------------------------------------------------- the internal ops --

fn build_apply_link(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let offset = ctx.args.i64("offset", 0)?;
    let window = ctx.args.int::<usize>("window", 1)?;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let t = read_timestep(l.tensor(0)?, "rnn_internal_apply_link")?;
        let row = usize::try_from(t as i64 + offset).map_err(|_| {
            Error::invalid_arg(format!(
                "rnn_internal_apply_link: row {t} + {offset} is negative"
            ))
        })?;
        let v = rows(l.tensor(1)?, row, window, "rnn_internal_apply_link")
            .map_err(|e| e.with_blob(l.input_name(1)))?;
        l.set_output(0, v);
        if !l.aliases(1, 1) {
            let e = l.tensor(1)?.clone();
            l.set_output(1, e);
        }
        Ok(true)
    }))
}

fn build_accumulate(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let offset = ctx
        .args
        .i64_opt("offset")?
        .filter(|&o| o >= 0)
        .ok_or_else(|| {
            ctx.bad_arg("rnn_internal_accumulate_gradient_input needs an 'offset' >= 0")
        })? as usize;
    Ok(kernel(move |cx| {
        let three = cx.num_inputs() == 3;
        let mut l = cx.lock();
        let op = "rnn_internal_accumulate_gradient_input";
        let t = read_timestep(l.tensor(0)?, op)?;
        let og = l.tensor(1)?.clone();
        if three && !l.aliases(2, 0) {
            let g = l.tensor(2)?.clone();
            l.set_output(0, g);
        }
        let name = l.output_name(0).to_string();
        let BlobValue::Tensor(g) = l.output(0) else {
            return Err(Error::type_error(format!(
                "{op}: the gradient to add into holds no tensor"
            ))
            .with_blob(&name));
        };
        add_rows(g, t + offset, &og, t, 1, op).map_err(|e| e.with_blob(&name))?;
        Ok(true)
    }))
}

fn build_blob_fetcher(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let prefix = ctx.args.string("prefix", "rnn")?;
    Ok(kernel(move |cx| {
        let scratch = cx
            .input_blob(0)
            .read()
            .object::<StepWorkspaces>("RecurrentStepWorkspaces")
            .map_err(|e| e.with_blob(&cx.io.input_names[0]))?;
        let names = scratch.names.lock().clone();
        let steps = *scratch.kept_steps.lock();
        let mut out: Vec<Vec<u8>> = Vec::new();
        {
            let slots = scratch.steps.lock();
            for (t, slot) in slots.iter().take(steps).enumerate() {
                for (name, v) in names.iter().zip(slot) {
                    let copy = format!("{prefix}_{name}{t}");
                    cx.ws.create_blob(&copy).set(v.clone());
                    out.push(copy.into_bytes());
                }
            }
        }
        let n = out.len();
        let names =
            ArrayD::from_shape_vec(IxDyn(&[n]), out).map_err(|e| Error::internal(e.to_string()))?;
        cx.output_blob(0)
            .set(BlobValue::Tensor(Tensor::from(names)));
        Ok(true)
    }))
}

fn build_write_link(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let offset = ctx.args.i64("offset", 0)?;
    Ok(kernel(move |cx| {
        let op = "rnn_internal_write_link";
        let mut l = cx.lock();
        let t = read_timestep(l.tensor(0)?, op)?;
        let row = usize::try_from(t as i64 + offset)
            .map_err(|_| Error::invalid_arg(format!("{op}: row {t} + {offset} is negative")))?;
        let src = l.tensor(1)?.clone();
        let name = l.output_name(0).to_string();
        let BlobValue::Tensor(dst) = l.output(0) else {
            return Err(
                Error::type_error(format!("{op}: the external blob holds no tensor"))
                    .with_blob(&name),
            );
        };
        write_rows(dst, row, &src, op).map_err(|e| e.with_blob(&name))?;
        Ok(true)
    }))
}
