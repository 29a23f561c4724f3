//! The recurrent cells: `LSTMUnit` and `GRUUnit` take one timestep of an LSTM
//! or a GRU from gate pre-activations computed by other ops (an FC of the
//! input and one of the previous hidden state, summed), and their gradient
//! ops. Caffe2's layout: the state blobs are `(1, N, D)`, the gates
//! `(1, N, G*D)` with the gates one after another along the last dim (LSTM:
//! input, forget, output, cell candidate; GRU: reset, update, output), and
//! a row `n` whose sequence has ended (`timestep >= seq_lengths[n]`) is
//! carried over unchanged, or zeroed with `drop_states`.

#![allow(clippy::result_large_err)]

use super::super::kit::*;
use crate::arg;
use crate::error::{Error, Result};
use crate::num::Float;
use crate::operator::{ArgDoc, InPlace, Locked, OpDefCtx, OpSchema, Operator};
use crate::tensor::Tensor;
use std::mem::MaybeUninit;

const LSTM_ARGS: &[ArgDoc] = &[
    arg!(
        "forget_bias",
        "float",
        "0.0",
        "added to the forget gate's pre-activation"
    ),
    arg!(
        "drop_states",
        "bool",
        "false",
        "a row past its sequence's end gets zero state (and passes no gradient back) instead of the previous one"
    ),
    arg!(
        "sequence_lengths",
        "bool",
        "true",
        "the op takes the seq_lengths input (false: every row is live at every step)"
    ),
];

const GRU_ARGS: &[ArgDoc] = &[
    arg!(
        "drop_states",
        "bool",
        "false",
        "a row past its sequence's end gets zero state (and passes no gradient back) instead of the previous one"
    ),
    arg!(
        "sequence_lengths",
        "bool",
        "true",
        "the op takes the seq_lengths input (false: every row is live at every step)"
    ),
];

/// gru_cell passes the LSTM's forget_bias; a GRU has no forget gate.
const GRU_IGNORED: &[ArgDoc] = &[arg!(
    "forget_bias",
    "float",
    "0.0",
    "accepted and unused (gru_cell passes it)"
)];

pub fn schemas() -> Vec<OpSchema> {
    vec![
        OpSchema::new("LSTMUnit", build_lstm)
            .inputs(4, 5)
            .outputs(2, 2)
            .args(LSTM_ARGS)
            .infer(|_, ins, n| Ok(crate::shapes::rules::same_as_input(ins, 1, n)))
            .doc("One LSTM timestep. Inputs (hidden_t_prev, cell_t_prev, gates, [seq_lengths,] timestep): states (1, N, D), gates (1, N, 4D) in the order input, forget, output, cell candidate; seq_lengths int (N), present unless sequence_lengths is false; timestep an int scalar. Outputs (hidden_t, cell_t): c = sigmoid(f + forget_bias) * c_prev + sigmoid(i) * tanh(g), h = sigmoid(o) * tanh(c) for rows with timestep < seq_lengths; other rows keep (h_prev, c_prev), or 0 with drop_states."),
        OpSchema::new("LSTMUnitGradient", build_lstm_grad)
            .inputs(8, 9)
            .outputs(3, 3)
            .args(LSTM_ARGS)
            .infer(|_, ins, _| Ok(vec![
                crate::shapes::rules::same_as_input(ins, 0, 1).remove(0),
                crate::shapes::rules::same_as_input(ins, 1, 1).remove(0),
                crate::shapes::rules::same_as_input(ins, 2, 1).remove(0),
            ]))
            .doc("Gradient of LSTMUnit. Inputs (hidden_t_prev, cell_t_prev, gates, [seq_lengths,] timestep, hidden_t, cell_t, hidden_t_grad, cell_t_grad); outputs (hidden_t_prev_grad, cell_t_prev_grad, gates_grad). For a live row the hidden state's gradient reaches h_prev through the gates (their FC), so hidden_t_prev_grad is 0 there; a finished row passes both gradients through (0 with drop_states)."),
        OpSchema::new("GRUUnit", build_gru)
            .inputs(3, 4)
            .outputs(1, 1)
            .inplace(InPlace::Never)
            .args(GRU_ARGS)
            .ignores(GRU_IGNORED)
            .infer(|_, ins, n| Ok(crate::shapes::rules::same_as_input(ins, 0, n)))
            .doc("One GRU timestep. Inputs (hidden_t_prev, gates, [seq_lengths,] timestep): hidden (1, N, D), gates (1, N, 3D) in the order reset, update, output (the reset gate is applied by the ops that make the output gate's pre-activation, so it is ignored here). Output hidden_t: u = sigmoid(update), h = u * h_prev + (1 - u) * tanh(output) for rows with timestep < seq_lengths; other rows keep h_prev, or 0 with drop_states."),
        OpSchema::new("GRUUnitGradient", build_gru_grad)
            .inputs(5, 6)
            .outputs(2, 2)
            .args(GRU_ARGS)
            .ignores(GRU_IGNORED)
            .infer(|_, ins, _| Ok(vec![
                crate::shapes::rules::same_as_input(ins, 0, 1).remove(0),
                crate::shapes::rules::same_as_input(ins, 1, 1).remove(0),
            ]))
            .doc("Gradient of GRUUnit. Inputs (hidden_t_prev, gates, [seq_lengths,] timestep, hidden_t, hidden_t_grad); outputs (hidden_t_prev_grad, gates_grad); the reset gate's gradient is 0."),
    ]
}

// ------------------------------------------------------------ arguments --

/// A cell op's arguments and where its inputs sit.
#[derive(Clone, Copy)]
struct Cell {
    op: &'static str,
    forget_bias: f64,
    drop_states: bool,
    /// The index of seq_lengths, if the op takes it.
    seq: Option<usize>,
    /// The index of timestep; the gradient's further inputs follow it.
    timestep: usize,
}

/// Reads the arguments and checks the input count against
/// `sequence_lengths` (`first` is the index of seq_lengths, `extra` the
/// inputs after timestep).
fn cell(ctx: &OpDefCtx<'_>, op: &'static str, first: usize, extra: usize) -> Result<Cell> {
    let with_seq = ctx.args.bool("sequence_lengths", true)?;
    let forget_bias = f64::from(ctx.args.f32("forget_bias", 0.0)?);
    let want = first + usize::from(with_seq) + 1 + extra;
    if ctx.num_inputs() != want {
        return Err(ctx.bad_arg(format!(
            "{op} takes {want} inputs with sequence_lengths={}, got {}",
            i32::from(with_seq),
            ctx.num_inputs()
        )));
    }
    Ok(Cell {
        op,
        forget_bias,
        drop_states: ctx.args.bool("drop_states", false)?,
        seq: with_seq.then_some(first),
        timestep: first + usize::from(with_seq),
    })
}

// ------------------------------------------------------------ the rows --

/// The batch size N and state size D of a `(1, N, D)` state input `i`.
fn state_dims(l: &Locked<'_>, op: &str, i: usize) -> Result<(usize, usize)> {
    let s = l.tensor(i)?.shape();
    if s.len() != 3 || s[0] != 1 {
        return Err(Error::shape(format!(
            "{op}: '{}' must have shape (1, N, D), got {s:?}",
            l.input_name(i)
        ))
        .with_blob(l.input_name(i)));
    }
    Ok((s[1], s[2]))
}

/// Checks that input `i` has shape `want`.
fn expect_shape(l: &Locked<'_>, op: &str, i: usize, want: &[usize]) -> Result<()> {
    let s = l.tensor(i)?.shape();
    if s != want {
        return Err(Error::shape(format!(
            "{op}: '{}' must have shape {want:?}, got {s:?}",
            l.input_name(i)
        ))
        .with_blob(l.input_name(i)));
    }
    Ok(())
}

/// Which of the N rows are live at this timestep (`t < seq_lengths[n]`).
fn live_rows(l: &Locked<'_>, c: &Cell, n: usize) -> Result<Vec<bool>> {
    let tt = l.tensor(c.timestep)?;
    let t = match int_values(tt)? {
        Some(v) if !v.is_empty() => v[0],
        _ => {
            let name = l.input_name(c.timestep);
            return Err(Error::type_error(format!(
                "{}: the timestep ('{name}') must be an int32 or int64 scalar, got a {} tensor of shape {:?}",
                c.op,
                tt.dtype(),
                tt.shape()
            ))
            .with_blob(name));
        }
    };
    let Some(si) = c.seq else {
        return Ok(vec![true; n]);
    };
    let st = l.tensor(si)?;
    match int_values(st)? {
        Some(lens) if lens.len() == n => Ok(lens.iter().map(|&len| t < len).collect()),
        _ => {
            let name = l.input_name(si);
            Err(Error::invalid_arg(format!(
                "{}: seq_lengths ('{name}') must be {n} int32 or int64 values (one per row), got a {} tensor of shape {:?}",
                c.op,
                st.dtype(),
                st.shape()
            ))
            .with_blob(name))
        }
    }
}

/// The cells' gate functions: float32 by `crate::vmath`'s vectorisable
/// approximations (a few ulps), float64 exactly (std).
#[inline(always)]
fn sigmoid<T: Float>(x: T) -> T {
    x.vsigmoid()
}

#[inline(always)]
fn tanh<T: Float>(x: T) -> T {
    x.vtanh()
}

/// One row's four gate blocks of length `d` (LSTM: input, forget, output,
/// cell candidate).
#[inline(always)]
fn gates4<T>(row: &[T], d: usize) -> (&[T], &[T], &[T], &[T]) {
    let (a, rest) = row.split_at(d);
    let (b, rest) = rest.split_at(d);
    let (c, e) = rest.split_at(d);
    (a, b, c, e)
}

/// A `(1, N, D)`-shaped output of `v`.
fn out<T: Float>(shape: &[usize], v: Vec<T>) -> Result<Tensor> {
    Ok(T::wrap(array(shape, v)?))
}

/// `len` elements of a cell's output that its rows write in full (live
/// rows computed, the others copied or zeroed), not cleared first: the
/// LSTM's gates' gradient was a 128 KiB `calloc` a step, zeroed then
/// overwritten.
fn unwritten<T>(len: usize, what: &str) -> Result<Vec<MaybeUninit<T>>> {
    let mut v = crate::tensor::try_vec(len, what)?;
    v.resize_with(len, MaybeUninit::uninit);
    Ok(v)
}

/// The values of `v`.
///
/// # Safety
/// Every element of `v` was written.
unsafe fn written<T>(v: Vec<MaybeUninit<T>>) -> Vec<T> {
    let mut v = std::mem::ManuallyDrop::new(v);
    // SAFETY: MaybeUninit<T> has T's layout; the caller wrote every
    // element; the allocation moves from `v` (not dropped) to the result.
    unsafe { Vec::from_raw_parts(v.as_mut_ptr().cast::<T>(), v.len(), v.capacity()) }
}

/// `to = from`.
#[inline(always)]
fn put<T: Copy>(to: &mut [MaybeUninit<T>], from: &[T]) {
    for (t, &f) in to.iter_mut().zip(from) {
        t.write(f);
    }
}

/// `to = from` if `copy`, else zeros (a row the step leaves or drops).
#[inline(always)]
fn put_or_zero<T: Float>(to: &mut [MaybeUninit<T>], from: &[T], copy: bool) {
    if copy {
        put(to, from);
    } else {
        for t in to.iter_mut() {
            t.write(T::ZERO);
        }
    }
}

/// Rows per block of a cell of `n` rows of `d` state elements: blocks run
/// on this thread and on pool threads idle at the time (`threads::fork`,
/// which wakes none). Four blocks at most, so a helper that comes late
/// still finds one; none below [`FORK_MIN`] elements, where a block is
/// shorter than its hand-off.
fn rows_per_piece(n: usize, d: usize) -> usize {
    if n * d < FORK_MIN {
        n.max(1)
    } else {
        n.div_ceil(n.min(4))
    }
}

/// The fewest state elements (rows x d) of a cell whose rows are shared.
const FORK_MIN: usize = 4096;

// ----------------------------------------------------------------- LSTM --

fn build_lstm(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let c = cell(ctx, "LSTMUnit", 3, 0)?;
    float_kernel!("LSTMUnit", 0, |l| lstm_t(&mut l, &c))
}

fn lstm_t<T: Float>(l: &mut Locked<'_>, c: &Cell) -> Result<()> {
    let op = c.op;
    let (n, d) = state_dims(l, op, 1)?;
    let shape = [1, n, d];
    expect_shape(l, op, 0, &shape)?;
    expect_shape(l, op, 2, &[1, n, 4 * d])?;
    let live = live_rows(l, c, n)?;
    let (h_prev, c_prev, x) = (
        dense(input::<T>(l, op, 0)?),
        dense(input::<T>(l, op, 1)?),
        dense(input::<T>(l, op, 2)?),
    );
    let mut h = unwritten::<T>(n * d, "LSTMUnit's hidden_t")?;
    let mut cell = unwritten::<T>(n * d, "LSTMUnit's cell_t")?;
    let fb = T::of(c.forget_bias);
    // Rows r0.. of the outputs, on the widest vectors the CPU has (same
    // bits on every path), in blocks shared with idle pool threads.
    let rows = |r0: usize, hs: &mut [MaybeUninit<T>], cs: &mut [MaybeUninit<T>]| {
        crate::vmath::wide(
            #[inline(always)]
            || {
                let outs = hs.chunks_exact_mut(d).zip(cs.chunks_exact_mut(d));
                for (j, (hr, cr)) in outs.enumerate() {
                    let r = r0 + j;
                    let (s, g) = (r * d, r * 4 * d);
                    let (hp, cp) = (&h_prev[s..s + d], &c_prev[s..s + d]);
                    if !live[r] {
                        put_or_zero(hr, hp, !c.drop_states);
                        put_or_zero(cr, cp, !c.drop_states);
                        continue;
                    }
                    lstm_row(gates4(&x[g..g + 4 * d], d), cp, hr, cr, fb);
                }
            },
        )
    };
    if d > 0 {
        let per = rows_per_piece(n, d);
        let parts = h.chunks_mut(per * d).zip(cell.chunks_mut(per * d));
        let parts = parts
            .enumerate()
            .map(|(i, (a, b))| (i * per, a, b))
            .collect();
        crate::threads::fork_each(parts, |(r0, hs, cs)| rows(r0, hs, cs));
    }
    // SAFETY: `rows` wrote every row of both (live or not).
    let (h, cell) = unsafe { (written(h), written(cell)) };
    let (h, cell) = (out(&shape, h)?, out(&shape, cell)?);
    l.set_output(0, h);
    l.set_output(1, cell);
    Ok(())
}

fn build_lstm_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let c = cell(ctx, "LSTMUnitGradient", 3, 4)?;
    float_kernel!("LSTMUnitGradient", 0, |l| lstm_grad_t(&mut l, &c))
}

fn lstm_grad_t<T: Float>(l: &mut Locked<'_>, c: &Cell) -> Result<()> {
    let op = c.op;
    let (n, d) = state_dims(l, op, 1)?;
    let shape = [1, n, d];
    let gshape = [1, n, 4 * d];
    let (ct_i, hg_i, cg_i) = (c.timestep + 2, c.timestep + 3, c.timestep + 4);
    expect_shape(l, op, 0, &shape)?;
    expect_shape(l, op, 2, &gshape)?;
    for i in [ct_i, hg_i, cg_i] {
        expect_shape(l, op, i, &shape)?;
    }
    let live = live_rows(l, c, n)?;
    let (c_prev, x, c_t, dh, dc) = (
        dense(input::<T>(l, op, 1)?),
        dense(input::<T>(l, op, 2)?),
        dense(input::<T>(l, op, ct_i)?),
        dense(input::<T>(l, op, hg_i)?),
        dense(input::<T>(l, op, cg_i)?),
    );
    let mut dh_prev = crate::tensor::zeroed_vec::<T>(&shape, "hidden_t_prev's gradient")?;
    let mut dc_prev = unwritten::<T>(n * d, "cell_t_prev's gradient")?;
    let mut dx = unwritten::<T>(n * 4 * d, "the gates' gradient")?;
    let fb = T::of(c.forget_bias);
    // Rows r0.. of the three outputs, on the widest vectors.
    let rows =
        |r0: usize, dhs: &mut [T], dcs: &mut [MaybeUninit<T>], dxs: &mut [MaybeUninit<T>]| {
            crate::vmath::wide(
                #[inline(always)]
                || {
                    let outs = dhs
                        .chunks_exact_mut(d)
                        .zip(dcs.chunks_exact_mut(d))
                        .zip(dxs.chunks_exact_mut(4 * d));
                    for (j, ((dhp, dcp), dxr)) in outs.enumerate() {
                        let r = r0 + j;
                        let (s, g) = (r * d, r * 4 * d);
                        let (dhr, dcr) = (&dh[s..s + d], &dc[s..s + d]);
                        if !live[r] {
                            if !c.drop_states {
                                dhp.copy_from_slice(dhr);
                            }
                            put_or_zero(dcp, dcr, !c.drop_states);
                            put_or_zero(dxr, &[], false);
                            continue;
                        }
                        let ins = [&c_prev[s..s + d], &c_t[s..s + d], dhr, dcr];
                        lstm_grad_row(gates4(&x[g..g + 4 * d], d), ins, dcp, dxr, fb);
                    }
                },
            )
        };
    if d > 0 {
        let per = rows_per_piece(n, d);
        let parts = dh_prev.chunks_mut(per * d).zip(dc_prev.chunks_mut(per * d));
        let parts = parts.zip(dx.chunks_mut(per * 4 * d)).enumerate();
        let parts = parts.map(|(i, ((a, b), e))| (i * per, a, b, e)).collect();
        crate::threads::fork_each(parts, |(r0, a, b, e)| rows(r0, a, b, e));
    }
    // SAFETY: `rows` wrote every row of both (live or not).
    let (dc_prev, dx) = unsafe { (written(dc_prev), written(dx)) };

    let (a, b, e) = (
        out(&shape, dh_prev)?,
        out(&shape, dc_prev)?,
        out(&gshape, dx)?,
    );
    l.set_output(0, a);
    l.set_output(1, b);
    l.set_output(2, e);
    Ok(())
}

/// Elements per block of the LSTM cells' inner loops: a block of each
/// operand is copied into a local array, computed there and copied out, so
/// the compiler vectorises the block without having to prove that the
/// outputs do not overlap the inputs (it did not, once the outputs came
/// from chunks of row blocks: 17 -> 160 us, scalar code). Each element is
/// computed by the same operations either way.
const LANES: usize = 16;

/// Elements `k..k + LANES` of `s`.
#[inline(always)]
fn lanes<T: Copy>(s: &[T], k: usize) -> [T; LANES] {
    let mut a = [s[k]; LANES];
    a.copy_from_slice(&s[k..k + LANES]);
    a
}

/// One element of an LSTM step: (c, h) from the gates' pre-activations
/// and the previous cell state.
#[inline(always)]
fn lstm_elem<T: Float>(xi: T, xf: T, xo: T, xg: T, cp: T, fb: T) -> (T, T) {
    let i = sigmoid(xi);
    let f = sigmoid(xf + fb);
    let o = sigmoid(xo);
    let cand = tanh(xg);
    let ct = f * cp + i * cand;
    (ct, o * tanh(ct))
}

/// One live row of `LSTMUnit`: `cr`, `hr` from the row's gates and `cp`.
#[inline(always)]
fn lstm_row<T: Float>(
    (xi, xf, xo, xg): (&[T], &[T], &[T], &[T]),
    cp: &[T],
    hr: &mut [MaybeUninit<T>],
    cr: &mut [MaybeUninit<T>],
    fb: T,
) {
    let d = hr.len();
    let mut k = 0;
    while k + LANES <= d {
        let (i, f, o, g, c) = (
            lanes(xi, k),
            lanes(xf, k),
            lanes(xo, k),
            lanes(xg, k),
            lanes(cp, k),
        );
        let (mut cs, mut hs) = (c, c);
        for j in 0..LANES {
            (cs[j], hs[j]) = lstm_elem(i[j], f[j], o[j], g[j], c[j], fb);
        }
        put(&mut cr[k..k + LANES], &cs);
        put(&mut hr[k..k + LANES], &hs);
        k += LANES;
    }
    for k in k..d {
        let (c, h) = lstm_elem(xi[k], xf[k], xo[k], xg[k], cp[k], fb);
        cr[k].write(c);
        hr[k].write(h);
    }
}

/// One element of an LSTM step's gradient: the previous cell's gradient
/// and the four gates', from the gates' pre-activations, the previous and
/// new cell state and the outputs' gradients `dh`, `dc`.
#[inline(always)]
fn lstm_grad_elem<T: Float>(x: [T; 4], cp: T, ct: T, dh: T, dc: T, fb: T) -> (T, [T; 4]) {
    let one = T::of(1.0);
    let i = sigmoid(x[0]);
    let f = sigmoid(x[1] + fb);
    let o = sigmoid(x[2]);
    let cand = tanh(x[3]);
    let tc = tanh(ct);
    // The cell's total gradient: its own, and the hidden state's through
    // h = o * tanh(c).
    let dct = dc + dh * o * (one - tc * tc);
    (
        dct * f,
        [
            dct * cand * i * (one - i),
            dct * cp * f * (one - f),
            dh * tc * o * (one - o),
            dct * i * (one - cand * cand),
        ],
    )
}

/// One live row of `LSTMUnitGradient`: `dcp` and the gates' gradient `dx`
/// (4 blocks of d) from the row's gates and `[c_prev, c_t, dh, dc]`.
#[inline(always)]
fn lstm_grad_row<T: Float>(
    (xi, xf, xo, xg): (&[T], &[T], &[T], &[T]),
    [cp, ct, dh, dc]: [&[T]; 4],
    dcp: &mut [MaybeUninit<T>],
    dx: &mut [MaybeUninit<T>],
    fb: T,
) {
    let d = dcp.len();
    let mut k = 0;
    while k + LANES <= d {
        let x = [lanes(xi, k), lanes(xf, k), lanes(xo, k), lanes(xg, k)];
        let (c0, c1, h, e) = (lanes(cp, k), lanes(ct, k), lanes(dh, k), lanes(dc, k));
        let mut dc_out = c0;
        let mut dg = x;
        for j in 0..LANES {
            let (a, b) = lstm_grad_elem(
                [x[0][j], x[1][j], x[2][j], x[3][j]],
                c0[j],
                c1[j],
                h[j],
                e[j],
                fb,
            );
            dc_out[j] = a;
            for (q, v) in b.into_iter().enumerate() {
                dg[q][j] = v;
            }
        }
        put(&mut dcp[k..k + LANES], &dc_out);
        for (q, v) in dg.iter().enumerate() {
            put(&mut dx[q * d + k..q * d + k + LANES], v);
        }
        k += LANES;
    }
    for k in k..d {
        let (a, b) = lstm_grad_elem([xi[k], xf[k], xo[k], xg[k]], cp[k], ct[k], dh[k], dc[k], fb);
        dcp[k].write(a);
        for (q, v) in b.into_iter().enumerate() {
            dx[q * d + k].write(v);
        }
    }
}

// ------------------------------------------------------------------ GRU --

fn build_gru(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let c = cell(ctx, "GRUUnit", 2, 0)?;
    float_kernel!("GRUUnit", 0, |l| gru_t(&mut l, &c))
}

fn gru_t<T: Float>(l: &mut Locked<'_>, c: &Cell) -> Result<()> {
    let op = c.op;
    let (n, d) = state_dims(l, op, 0)?;
    let shape = [1, n, d];
    expect_shape(l, op, 1, &[1, n, 3 * d])?;
    let live = live_rows(l, c, n)?;
    let (h_prev, x) = (dense(input::<T>(l, op, 0)?), dense(input::<T>(l, op, 1)?));
    let mut h = crate::tensor::zeroed_vec::<T>(&shape, "GRUUnit's hidden_t")?;
    let one = T::of(1.0);
    crate::vmath::wide(
        #[inline(always)]
        || {
            for (r, &alive) in live.iter().enumerate() {
                let (s, g) = (r * d, r * 3 * d);
                let (hr, hp) = (&mut h[s..s + d], &h_prev[s..s + d]);
                if !alive {
                    if !c.drop_states {
                        hr.copy_from_slice(hp);
                    }
                    continue;
                }
                let (xu, xo) = (&x[g + d..g + 2 * d], &x[g + 2 * d..g + 3 * d]);
                for k in 0..d {
                    let u = sigmoid(xu[k]);
                    let o = tanh(xo[k]);
                    hr[k] = u * hp[k] + (one - u) * o;
                }
            }
        },
    );
    let h = out(&shape, h)?;
    l.set_output(0, h);
    Ok(())
}

fn build_gru_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let c = cell(ctx, "GRUUnitGradient", 2, 2)?;
    float_kernel!("GRUUnitGradient", 0, |l| gru_grad_t(&mut l, &c))
}

fn gru_grad_t<T: Float>(l: &mut Locked<'_>, c: &Cell) -> Result<()> {
    let op = c.op;
    let (n, d) = state_dims(l, op, 0)?;
    let shape = [1, n, d];
    let gshape = [1, n, 3 * d];
    let hg_i = c.timestep + 2;
    expect_shape(l, op, 1, &gshape)?;
    expect_shape(l, op, c.timestep + 1, &shape)?;
    expect_shape(l, op, hg_i, &shape)?;
    let live = live_rows(l, c, n)?;
    let (h_prev, x, dh) = (
        dense(input::<T>(l, op, 0)?),
        dense(input::<T>(l, op, 1)?),
        dense(input::<T>(l, op, hg_i)?),
    );
    let mut dh_prev = crate::tensor::zeroed_vec::<T>(&shape, "hidden_t_prev's gradient")?;
    let mut dx = crate::tensor::zeroed_vec::<T>(&gshape, "the gates' gradient")?;
    let one = T::of(1.0);
    crate::vmath::wide(
        #[inline(always)]
        || {
            for (r, &alive) in live.iter().enumerate() {
                let (s, g) = (r * d, r * 3 * d);
                let (dhr, dhp) = (&dh[s..s + d], &mut dh_prev[s..s + d]);
                if !alive {
                    if !c.drop_states {
                        dhp.copy_from_slice(dhr);
                    }
                    continue;
                }
                let hp = &h_prev[s..s + d];
                let (xu, xo) = (&x[g + d..g + 2 * d], &x[g + 2 * d..g + 3 * d]);
                let (dxu, dxo) = dx[g + d..g + 3 * d].split_at_mut(d);
                for k in 0..d {
                    let u = sigmoid(xu[k]);
                    let o = tanh(xo[k]);
                    dhp[k] = dhr[k] * u;
                    dxu[k] = dhr[k] * (hp[k] - o) * u * (one - u);
                    dxo[k] = dhr[k] * (one - u) * (one - o * o);
                }
            }
        },
    );
    let (a, b) = (out(&shape, dh_prev)?, out(&gshape, dx)?);
    l.set_output(0, a);
    l.set_output(1, b);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigmoid_and_tanh_are_stable_at_the_extremes() {
        assert_eq!(sigmoid(-1000.0f64), 0.0);
        assert_eq!(sigmoid(1000.0f64), 1.0);
        assert!((sigmoid(0.0f32) - 0.5).abs() < 1e-7);
        assert_eq!(tanh(-50.0f32), -1.0);
        assert!((tanh(0.5f64) - 0.5f64.tanh()).abs() < 1e-15);
    }
}
