//! Nets: an ordered list of bound operators, run one after another.

use crate::cancel::{self, CancelToken};
use crate::error::{from_panic, Error, ErrorKind, Result};
use crate::ir::{Argument, NetDef, OperatorDef, MAX_NESTING};
use crate::operator::{allows_unknown_args, create_operator_with, OpCx, OpIo, Operator};
use crate::trace::{self, NetNames, NetRecord, OpClock, Stamps};
use crate::workspace::Workspace;
use parking_lot::{Mutex, MutexGuard};
use std::borrow::Cow;
use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

thread_local! {
    /// Nets being created or run on this thread, one inside another (Do, If
    /// and While build and run their nets from inside an op).
    static NESTING: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many nets may be created or run one inside another: as many as a
/// decoded message can hold (a net argument is three messages below its
/// net, NetDef > OperatorDef > Argument > NetDef, so 100 levels of messages
/// hold 34 nets). A plan built in Rust is not bounded by the decoder; this
/// bound keeps the recursion within a thread's stack even in debug builds.
pub const MAX_NET_NESTING: usize = MAX_NESTING / 3 + 1;

/// One level of [`NESTING`], for the life of a `Net::create` or `Net::run`.
struct Nested;

impl Nested {
    fn enter(net: &str) -> Result<Nested> {
        let depth = NESTING.get() + 1;
        if depth > MAX_NET_NESTING {
            return Err(Error::invalid_plan(format!(
                "nets are nested more than {MAX_NET_NESTING} levels deep (Do, If and While nets inside each other)"
            ))
            .with_net(net));
        }
        NESTING.set(depth);
        Ok(Nested)
    }
}

impl Drop for Nested {
    fn drop(&mut self) {
        NESTING.set(NESTING.get() - 1);
    }
}

/// A net shared by the workspace that owns it and the steps that run it.
pub type SharedNet = Arc<NetCell>;

/// A net behind the mutex that serialises its runs (Caffe2 raced on op
/// state), with the thread running it, so that a run waiting for it can tell
/// a net it already runs itself (a Python op running its own net again) or
/// one held by an abandoned run from a merely busy one.
pub struct NetCell {
    net: Mutex<Net>,
    name: String,
    /// `cancel::thread_tag()` of the thread holding `net`, 0 when free (or
    /// just taken and not yet recorded).
    holder: AtomicU64,
}

/// A net locked for a run.
pub struct NetGuard<'a> {
    cell: &'a NetCell,
    net: MutexGuard<'a, Net>,
}

impl std::ops::Deref for NetGuard<'_> {
    type Target = Net;
    fn deref(&self) -> &Net {
        &self.net
    }
}

impl std::ops::DerefMut for NetGuard<'_> {
    fn deref_mut(&mut self) -> &mut Net {
        &mut self.net
    }
}

impl Drop for NetGuard<'_> {
    fn drop(&mut self) {
        // Before the mutex is released (the field is dropped after this).
        self.cell.holder.store(0, Ordering::Relaxed);
    }
}

impl NetCell {
    pub fn new(net: Net) -> SharedNet {
        Arc::new(NetCell {
            name: net.name.clone(),
            net: Mutex::new(net),
            holder: AtomicU64::new(0),
        })
    }

    /// Locks the net for a run. While another run has it, waits in slices
    /// that look at `cancel`; fails at once when this thread holds it
    /// already, and when its holder is stuck in a call of an abandoned run.
    pub fn lock(&self, cancel: &CancelToken) -> Result<NetGuard<'_>> {
        let net = match self.net.try_lock() {
            Some(g) => g,
            None => self.lock_slow(cancel)?,
        };
        self.holder.store(cancel::thread_tag(), Ordering::Relaxed);
        Ok(NetGuard { cell: self, net })
    }

    #[cold]
    fn lock_slow(&self, cancel: &CancelToken) -> Result<MutexGuard<'_, Net>> {
        let me = cancel::thread_tag();
        loop {
            let holder = self.holder.load(Ordering::Relaxed);
            // Only this thread stores its own tag, and clears it before
            // unlocking: seeing it means this thread holds the net.
            if holder == me {
                return Err(Error::failed(format!(
                    "net '{}' is already running on this thread: an op of it (a Python op?) runs it again, which would wait for itself",
                    self.name
                ))
                .with_net(&self.name));
            }
            if holder != 0 && cancel::abandoned_call_on(holder) {
                return Err(Error::failed(format!(
                    "net '{}' is still held by an interrupted run: an op in it (a Python op) has not returned yet; it was cancelled and releases the net when that op returns",
                    self.name
                ))
                .with_net(&self.name));
            }
            if cancel.poll_now() {
                return Err(Error::cancelled().with_net(&self.name));
            }
            if let Some(g) = self.net.try_lock_for(cancel::POLL) {
                return Ok(g);
            }
        }
    }

    /// The net's name (readable while it runs).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Locks the net without a token (tests and inspection).
    pub fn lock_now(&self) -> MutexGuard<'_, Net> {
        self.net.lock()
    }
}

struct OpSlot {
    op_type: String,
    io: OpIo,
    kernel: Box<dyn Operator>,
}

pub struct Net {
    name: String,
    ops: Vec<OpSlot>,
    /// The names a timeline or a per-op timing reports (`trace.rs`).
    names: Arc<NetNames>,
}

impl std::fmt::Debug for Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Net({:?}, {} ops)", self.name, self.ops.len())
    }
}

/// Net types Caffe2 accepted. All run sequentially here: declaration order is
/// a topological order, so results are the same.
const KNOWN_NET_TYPES: &[&str] = &[
    "",
    "simple",
    "dag",
    "async_dag",
    "prof_dag",
    "async_scheduling",
    "async_polling",
    "async_simple",
    "rnn",
    "parallel",
];

/// The net's device option merged into an op's (the op's own fields win).
fn merged_def(net: &NetDef, op: &OperatorDef) -> OperatorDef {
    let mut op = op.clone();
    if let Some(nd) = &net.device_option {
        let mut d = op.device_option.clone().unwrap_or_default();
        d.device_type = d.device_type.or(nd.device_type);
        d.device_id = d.device_id.or(nd.device_id);
        d.random_seed = d.random_seed.or(nd.random_seed);
        d.node_name = d.node_name.clone().or(nd.node_name.clone());
        op.device_option = Some(d);
    }
    op
}

impl Net {
    /// Validates the definition and constructs every op in order.
    pub fn create(def: &NetDef, ws: &Arc<Workspace>) -> Result<Net> {
        Net::create_with(def, ws, false)
    }

    /// [`Net::create`] for a net nested in an op's arguments: unknown op
    /// arguments are allowed when the enclosing net allowed them
    /// (`allow_unknown_args`) or this net's own arguments allow them.
    pub fn create_with(def: &NetDef, ws: &Arc<Workspace>, allow_unknown_args: bool) -> Result<Net> {
        // The scopes this net's gradient Do ops read keep their forward
        // workspaces (`keep_scopes`, for the control ops).
        let marked = keep_scopes(def);
        let def: &NetDef = marked.as_deref().unwrap_or(def);
        let allow_unknown_args = allow_unknown_args || allows_unknown_args(&def.arg);
        let name = def.net_name().to_string();
        let _nested = Nested::enter(&name)?;
        let ty = def.r#type.as_deref().unwrap_or("");
        if !KNOWN_NET_TYPES.contains(&ty) {
            return Err(Error::invalid_plan(format!("unknown net type '{ty}'")).with_net(&name));
        }
        // Declared external inputs bound what an op may read.
        if !def.external_input.is_empty() {
            let mut known: HashSet<&str> = def.external_input.iter().map(|s| s.as_str()).collect();
            for (k, op) in def.op.iter().enumerate() {
                for i in &op.input {
                    if !known.contains(i.as_str()) {
                        return Err(Error::invalid_plan(format!(
                            "source for input '{i}' is unknown: it is neither an external input of the net nor an output of an earlier op"
                        ))
                        .with_blob(i)
                        .with_op(op.op_type(), Some(k))
                        .with_net(&name));
                    }
                }
                known.extend(op.output.iter().map(|s| s.as_str()));
            }
        }
        let produced: HashSet<&str> = def
            .op
            .iter()
            .flat_map(|o| o.output.iter().map(|s| s.as_str()))
            .chain(def.external_input.iter().map(|s| s.as_str()))
            .collect();
        for o in &def.external_output {
            if !produced.contains(o.as_str()) {
                return Err(Error::invalid_plan(format!(
                    "external output '{o}' is neither produced by an op nor an external input"
                ))
                .with_blob(o)
                .with_net(&name));
            }
        }
        let mut ops = Vec::with_capacity(def.op.len());
        for (k, opdef) in def.op.iter().enumerate() {
            let opdef = merged_def(def, opdef);
            if opdef
                .device_option
                .as_ref()
                .and_then(|d| d.node_name.as_deref())
                .is_some_and(|n| !n.is_empty())
            {
                return Err(Error::invalid_plan(
                    "an op with a device_option.node_name cannot run in this process",
                )
                .with_op(opdef.op_type(), Some(k))
                .with_net(&name));
            }
            let built = catch_unwind(AssertUnwindSafe(|| {
                create_operator_with(&opdef, ws, allow_unknown_args)
            }))
            .unwrap_or_else(|p| Err(from_panic(p)));
            let (kernel, io) =
                built.map_err(|e| e.with_op(opdef.op_type(), Some(k)).with_net(&name))?;
            ops.push(OpSlot {
                op_type: opdef.op_type().to_string(),
                io,
                kernel,
            });
        }
        let names = Arc::new(NetNames {
            net: name.as_str().into(),
            ops: ops.iter().map(|o| o.op_type.as_str().into()).collect(),
        });
        Ok(Net { name, ops, names })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn num_ops(&self) -> usize {
        self.ops.len()
    }

    /// Runs the ops in order. `Ok(false)` when an op failed softly; later ops
    /// do not run. Errors (and caught panics) carry the op, its index and the net.
    /// While a timeline is recorded (`trace::on`, one relaxed load), each op
    /// is timed and the run recorded.
    pub fn run(&mut self, ws: &Arc<Workspace>, cancel: &CancelToken) -> Result<bool> {
        if trace::on() {
            return self.run_traced(ws, cancel);
        }
        self.run_ops::<false, _>(ws, cancel, &mut Stamps::new())
    }

    #[cold]
    fn run_traced(&mut self, ws: &Arc<Workspace>, cancel: &CancelToken) -> Result<bool> {
        let timed_ops = trace::ops_on();
        let Some(mut rec) = NetRecord::open(&self.names, timed_ops) else {
            return self.run_ops::<false, _>(ws, cancel, &mut Stamps::new());
        };
        let r = if timed_ops {
            self.run_ops::<true, _>(ws, cancel, &mut rec)
        } else {
            rec.stamp();
            self.run_ops::<false, _>(ws, cancel, &mut rec)
        };
        rec.close(matches!(r, Ok(true)));
        r
    }

    /// [`Net::run`] as the one net of a loop's iteration: while the loop
    /// records its iterations, the run (and each op, when ops are timed)
    /// goes into the loop's record (`trace::LoopRecord`) rather than a
    /// record of its own.
    pub fn run_in_loop(
        &mut self,
        ws: &Arc<Workspace>,
        cancel: &CancelToken,
        rec: &mut trace::LoopRecord<'_>,
    ) -> Result<bool> {
        let Some(timed) = rec.begin_run(&self.names) else {
            return self.run(ws, cancel);
        };
        let r = if timed {
            self.run_ops::<true, _>(ws, cancel, rec)
        } else {
            rec.stamp();
            self.run_ops::<false, _>(ws, cancel, rec)
        };
        rec.end_run(matches!(r, Ok(true)));
        r
    }

    /// [`Net::run`] timing every op: `stamps` gets the start of each op that
    /// runs (`trace::now`, clock ticks: `trace::ticks_to_ns`), the caller adds the end. The per-op timing
    /// of `Workspace::benchmark_net`.
    pub fn run_timed(
        &mut self,
        ws: &Arc<Workspace>,
        cancel: &CancelToken,
        stamps: &mut Stamps,
    ) -> Result<bool> {
        self.run_ops::<true, _>(ws, cancel, stamps)
    }

    /// The op types, in order.
    pub fn op_types(&self) -> impl Iterator<Item = &str> {
        self.ops.iter().map(|o| o.op_type.as_str())
    }

    #[inline(always)]
    fn run_ops<const TIMED: bool, C: OpClock>(
        &mut self,
        ws: &Arc<Workspace>,
        cancel: &CancelToken,
        stamps: &mut C,
    ) -> Result<bool> {
        let _nested = Nested::enter(&self.name)?;
        for (k, slot) in self.ops.iter_mut().enumerate() {
            if TIMED {
                stamps.op_start();
            }
            let mut cx = OpCx {
                io: &slot.io,
                ws,
                cancel,
            };
            let kernel = &mut slot.kernel;
            let r = catch_unwind(AssertUnwindSafe(|| kernel.run(&mut cx)))
                .unwrap_or_else(|p| Err(from_panic(p)));
            match r {
                Ok(true) => {}
                Ok(false) => return Ok(false),
                Err(mut e) => {
                    // An allocation that failed inside a kernel was for
                    // the op's only output (or the scratch computing it),
                    // whichever input the kernel's error path named.
                    if e.kind == ErrorKind::OutOfMemory && slot.io.output_names.len() == 1 {
                        e.context.blob = Some(slot.io.output_names[0].clone());
                    }
                    return Err(e.with_op(&slot.op_type, Some(k)).with_net(&self.name));
                }
            }
        }
        Ok(true)
    }
}

/// `def` with `keep_workspaces` set on each CreateScope (nested nets
/// included) whose scope blob a gradient Do of `def` reads, or None when
/// `def` holds no gradient Do.
pub fn keep_scopes(def: &NetDef) -> Option<Cow<'_, NetDef>> {
    fn gradient_scopes(def: &NetDef, out: &mut HashSet<String>) {
        for op in &def.op {
            if op.op_type() == "Do" && op.is_gradient_op.unwrap_or(false) {
                if let Some(s) = op.input.last() {
                    out.insert(s.clone());
                }
            }
            for a in &op.arg {
                for n in a.n.iter().chain(a.nets.iter()) {
                    gradient_scopes(n, out);
                }
            }
        }
    }
    fn mark(def: &mut NetDef, scopes: &HashSet<String>) {
        for op in &mut def.op {
            mark_op(op, scopes);
        }
    }
    fn mark_op(op: &mut OperatorDef, scopes: &HashSet<String>) {
        if op.op_type() == "CreateScope"
            && op.output.first().is_some_and(|s| scopes.contains(s))
            && !op
                .arg
                .iter()
                .any(|a| a.name.as_deref() == Some("keep_workspaces"))
        {
            op.arg.push(Argument {
                name: Some("keep_workspaces".to_string()),
                i: Some(1),
                ..Argument::default()
            });
        }
        for a in &mut op.arg {
            for n in a.n.iter_mut().chain(a.nets.iter_mut()) {
                mark(n, scopes);
            }
        }
    }
    let mut scopes = HashSet::new();
    gradient_scopes(def, &mut scopes);
    if scopes.is_empty() {
        return None;
    }
    let mut marked = def.clone();
    mark(&mut marked, &scopes);
    Some(Cow::Owned(marked))
}
