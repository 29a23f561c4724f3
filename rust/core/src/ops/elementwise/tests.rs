//! The elementwise family's tests.

use super::loops::*;
use super::schemas;
use crate::blob::BlobValue;
use crate::cancel::CancelToken;
use crate::error::ErrorKind;
use crate::ir::{Argument, OperatorDef};
use crate::operator::{create_operator, OpCx};
use crate::tensor::{DataType, Tensor};
use crate::test_util::{float_arg, get, int_arg, op, run, string_arg, tensor};
use crate::workspace::Workspace;
use ndarray::{ArrayD, IxDyn};
use std::sync::Arc;

fn ws(blobs: Vec<(&str, Tensor)>) -> Arc<Workspace> {
    let ws = Workspace::new();
    for (n, v) in blobs {
        ws.feed(n, BlobValue::Tensor(v));
    }
    ws
}

fn data_ptr(ws: &Arc<Workspace>, name: &str) -> usize {
    let b = ws.blob(name).unwrap();
    let g = b.read();
    crate::with_array!(g.tensor().unwrap(), a => a.as_ptr() as usize)
}

/// Builds the op once and runs it `times` times (kernel state kept).
fn run_kernel(ws: &Arc<Workspace>, d: &OperatorDef, times: usize) {
    let (mut k, io) = create_operator(d, ws).unwrap();
    let tok = CancelToken::new();
    for _ in 0..times {
        let mut cx = OpCx {
            io: &io,
            ws,
            cancel: &tok,
        };
        assert!(k.run(&mut cx).unwrap());
    }
}

// ---------------------------------------------------------- arithmetic --

#[test]
fn same_shape_arithmetic_all_dtypes() {
    let w = ws(vec![
        ("a", tensor(&[2, 2], vec![1.5f32, 2.0, -3.0, 4.0])),
        ("b", tensor(&[2, 2], vec![0.5f32, 4.0, 2.0, -8.0])),
        ("ad", tensor(&[3], vec![1.0f64, 2.0, 3.0])),
        ("bd", tensor(&[3], vec![0.25f64, 0.5, 4.0])),
        ("ai", tensor(&[3], vec![7i32, -7, 9])),
        ("bi", tensor(&[3], vec![2i32, 2, -4])),
        ("al", tensor(&[2], vec![10i64, -10])),
        ("bl", tensor(&[2], vec![3i64, 3])),
    ]);
    run(&w, op("Add", &["a", "b"], &["c"], vec![])).unwrap();
    assert_eq!(get(&w, "c"), tensor(&[2, 2], vec![2.0f32, 6.0, -1.0, -4.0]));
    run(&w, op("Sub", &["a", "b"], &["c"], vec![])).unwrap();
    assert_eq!(
        get(&w, "c"),
        tensor(&[2, 2], vec![1.0f32, -2.0, -5.0, 12.0])
    );
    run(&w, op("Mul", &["a", "b"], &["c"], vec![])).unwrap();
    assert_eq!(
        get(&w, "c"),
        tensor(&[2, 2], vec![0.75f32, 8.0, -6.0, -32.0])
    );
    run(&w, op("Div", &["a", "b"], &["c"], vec![])).unwrap();
    assert_eq!(get(&w, "c"), tensor(&[2, 2], vec![3.0f32, 0.5, -1.5, -0.5]));
    run(&w, op("Div", &["ad", "bd"], &["cd"], vec![])).unwrap();
    assert_eq!(get(&w, "cd"), tensor(&[3], vec![4.0f64, 4.0, 0.75]));
    run(&w, op("Mul", &["ai", "bi"], &["ci"], vec![])).unwrap();
    assert_eq!(get(&w, "ci"), tensor(&[3], vec![14i32, -14, -36]));
    run(&w, op("Sub", &["al", "bl"], &["cl"], vec![])).unwrap();
    assert_eq!(get(&w, "cl"), tensor(&[2], vec![7i64, -13]));
}

#[test]
fn integer_division_truncates_toward_zero() {
    let w = ws(vec![
        ("a", tensor(&[4], vec![7i32, -7, 7, -7])),
        ("b", tensor(&[4], vec![2i32, 2, -2, -2])),
        ("a64", tensor(&[3], vec![i64::MIN, 5, -1])),
        ("b64", tensor(&[3], vec![-1i64, 7, 3])),
    ]);
    run(&w, op("Div", &["a", "b"], &["c"], vec![])).unwrap();
    assert_eq!(get(&w, "c"), tensor(&[4], vec![3i32, -3, -3, 3]));
    // i64::MIN / -1 wraps to i64::MIN instead of trapping.
    run(&w, op("Div", &["a64", "b64"], &["c64"], vec![])).unwrap();
    assert_eq!(get(&w, "c64"), tensor(&[3], vec![i64::MIN, 0, 0]));
}

#[test]
fn integer_division_by_zero_is_an_error_and_writes_nothing() {
    let w = ws(vec![
        ("a", tensor(&[3], vec![1i32, 2, 3])),
        ("b", tensor(&[3], vec![1i32, 0, 1])),
    ]);
    let e = run(&w, op("Div", &["a", "b"], &["a"], vec![])).unwrap_err();
    assert_eq!(e.kind, ErrorKind::DivisionByZero);
    assert_eq!(e.context.blob.as_deref(), Some("b"));
    assert_eq!(e.context.op_type.as_deref(), Some("Div"));
    assert_eq!(get(&w, "a"), tensor(&[3], vec![1i32, 2, 3]));
    // A scalar zero divisor, int64.
    let w = ws(vec![
        ("a", tensor(&[2], vec![1i64, 2])),
        ("z", Tensor::scalar(0i64)),
    ]);
    let e = run(&w, op("Div", &["a", "z"], &["c"], vec![])).unwrap_err();
    assert_eq!(e.kind, ErrorKind::DivisionByZero);
    // An empty result divides nothing, so a zero divisor is fine.
    let w = ws(vec![
        ("a", tensor(&[0, 2], Vec::<i32>::new())),
        ("z", tensor(&[2], vec![0i32, 0])),
    ]);
    run(&w, op("Div", &["a", "z"], &["c"], vec![])).unwrap();
    assert_eq!(get(&w, "c").shape(), &[0, 2]);
}

#[test]
fn float_division_by_zero_is_ieee() {
    let w = ws(vec![
        ("a", tensor(&[3], vec![1.0f32, -1.0, 0.0])),
        ("z", Tensor::scalar(0.0f32)),
    ]);
    run(&w, op("Div", &["a", "z"], &["c"], vec![])).unwrap();
    let c = get(&w, "c");
    let c = c.array::<f32>().unwrap();
    assert_eq!(c[[0]], f32::INFINITY);
    assert_eq!(c[[1]], f32::NEG_INFINITY);
    assert!(c[[2]].is_nan());
}

#[test]
fn integer_overflow_wraps() {
    let w = ws(vec![
        ("a", tensor(&[3], vec![i32::MAX, i32::MIN, i32::MAX])),
        ("b", tensor(&[3], vec![1i32, 1, 2])),
    ]);
    run(&w, op("Add", &["a", "b"], &["c"], vec![])).unwrap();
    assert_eq!(
        get(&w, "c"),
        tensor(&[3], vec![i32::MIN, i32::MIN + 1, i32::MIN + 1])
    );
    run(&w, op("Sub", &["b", "a"], &["c"], vec![])).unwrap();
    // 1 - MAX = MIN + 2; 1 - MIN wraps to MIN + 1; 2 - MAX = MIN + 3.
    assert_eq!(
        get(&w, "c"),
        tensor(&[3], vec![i32::MIN + 2, i32::MIN + 1, i32::MIN + 3])
    );
    run(&w, op("Mul", &["a", "b"], &["c"], vec![])).unwrap();
    // MAX * 2 = 2^32 - 2 wraps to -2.
    assert_eq!(get(&w, "c"), tensor(&[3], vec![i32::MAX, i32::MIN, -2]));
}

// ------------------------------------------------------- broadcasting --

#[test]
fn numpy_broadcasting() {
    let w = ws(vec![
        ("m", tensor(&[2, 3], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0])),
        ("row", tensor(&[3], vec![10.0f32, 20.0, 30.0])),
        ("col", tensor(&[2, 1], vec![100.0f32, 200.0])),
        ("s", Tensor::scalar(0.5f32)),
        ("e", tensor(&[0, 3], Vec::<f32>::new())),
        ("one", tensor(&[1, 3], vec![1.0f32, 1.0, 1.0])),
    ]);
    run(&w, op("Add", &["m", "row"], &["c"], vec![])).unwrap();
    assert_eq!(
        get(&w, "c"),
        tensor(&[2, 3], vec![11.0f32, 22.0, 33.0, 14.0, 25.0, 36.0])
    );
    // B on the left: [3] - [2,3].
    run(&w, op("Sub", &["row", "m"], &["c"], vec![])).unwrap();
    assert_eq!(
        get(&w, "c"),
        tensor(&[2, 3], vec![9.0f32, 18.0, 27.0, 6.0, 15.0, 24.0])
    );
    // Both sides stretch: [2,1] + [3] -> [2,3].
    run(&w, op("Add", &["col", "row"], &["c"], vec![])).unwrap();
    assert_eq!(
        get(&w, "c"),
        tensor(&[2, 3], vec![110.0f32, 120.0, 130.0, 210.0, 220.0, 230.0])
    );
    run(&w, op("Mul", &["m", "col"], &["c"], vec![])).unwrap();
    assert_eq!(
        get(&w, "c"),
        tensor(&[2, 3], vec![100.0f32, 200.0, 300.0, 800.0, 1000.0, 1200.0])
    );
    // 0-dim scalar on either side.
    run(&w, op("Mul", &["s", "m"], &["c"], vec![])).unwrap();
    assert_eq!(
        get(&w, "c"),
        tensor(&[2, 3], vec![0.5f32, 1.0, 1.5, 2.0, 2.5, 3.0])
    );
    run(&w, op("Div", &["m", "s"], &["c"], vec![])).unwrap();
    assert_eq!(
        get(&w, "c"),
        tensor(&[2, 3], vec![2.0f32, 4.0, 6.0, 8.0, 10.0, 12.0])
    );
    run(&w, op("Add", &["s", "s"], &["c"], vec![])).unwrap();
    assert_eq!(get(&w, "c"), Tensor::scalar(1.0f32));
    // A 0 dim against a 1 gives 0: [0,3] + [1,3] -> [0,3].
    run(&w, op("Add", &["e", "one"], &["c"], vec![])).unwrap();
    assert_eq!(get(&w, "c").shape(), &[0, 3]);
    // [2,1] + [0] -> [2,0].
    let w2 = ws(vec![
        ("col", tensor(&[2, 1], vec![1i64, 2])),
        ("z", tensor(&[0], Vec::<i64>::new())),
    ]);
    run(&w2, op("Add", &["col", "z"], &["c"], vec![])).unwrap();
    assert_eq!(get(&w2, "c").shape(), &[2, 0]);
}

#[test]
fn a_kernel_rechecks_inputs_whose_shape_or_dtype_changed() {
    // One kernel, run again after its inputs change: the checks of the
    // first run are reused only for the same dtypes and shapes.
    let w = ws(vec![
        ("a", tensor(&[2], vec![1i32, 2])),
        ("b", tensor(&[2], vec![10i32, 20])),
    ]);
    let d = op("Add", &["a", "b"], &["a"], vec![]);
    let (mut k, io) = create_operator(&d, &w).unwrap();
    let tok = CancelToken::new();
    let mut again = || {
        k.run(&mut OpCx {
            io: &io,
            ws: &w,
            cancel: &tok,
        })
    };
    assert!(again().unwrap());
    assert_eq!(get(&w, "a"), tensor(&[2], vec![11i32, 22]));
    w.feed("b", BlobValue::Tensor(tensor(&[3], vec![1i32, 2, 3])));
    assert_eq!(again().unwrap_err().kind, ErrorKind::Shape);
    w.feed("b", BlobValue::Tensor(tensor(&[2], vec![1.0f32, 2.0])));
    assert_eq!(again().unwrap_err().kind, ErrorKind::Type);
    // In place, the result must keep A's shape: B [2, 2] would grow it.
    w.feed("b", BlobValue::Tensor(tensor(&[2, 2], vec![1i32; 4])));
    assert_eq!(again().unwrap_err().kind, ErrorKind::Shape);
    w.feed("b", BlobValue::Tensor(tensor(&[1], vec![5i32])));
    assert!(again().unwrap());
    assert_eq!(get(&w, "a"), tensor(&[2], vec![16i32, 27]));
    w.feed("a", BlobValue::Tensor(tensor(&[3], vec![0i32, 1, 2])));
    assert!(again().unwrap());
    assert_eq!(get(&w, "a"), tensor(&[3], vec![5i32, 6, 7]));
}

#[test]
fn numpy_broadcasting_mismatch_names_b() {
    let w = ws(vec![
        ("a", tensor(&[2, 3], vec![0i32; 6])),
        ("b", tensor(&[2], vec![1i32, 2])),
    ]);
    let e = run(&w, op("Add", &["a", "b"], &["c"], vec![])).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Shape);
    assert_eq!(e.context.blob.as_deref(), Some("b"));
    assert!(
        e.message.contains("[2, 3]") && e.message.contains("[2]"),
        "{}",
        e.message
    );
    assert!(!w.has_blob("c") || w.fetch("c").unwrap().is_empty());
}

#[test]
fn legacy_broadcasting() {
    // A [2,3,2], B [3] at axis 1: B[j] is added along dim 1.
    let a: Vec<i32> = (0..12).collect();
    let w = ws(vec![
        ("a", tensor(&[2, 3, 2], a)),
        ("b", tensor(&[3], vec![100i32, 200, 300])),
        ("b31", tensor(&[3, 1], vec![100i32, 200, 300])),
        ("b12", tensor(&[1, 2], vec![1000i32, 2000])),
        ("s", tensor(&[1, 1], vec![5i32])),
    ]);
    let want = tensor(
        &[2, 3, 2],
        vec![
            100i32, 101, 202, 203, 304, 305, 106, 107, 208, 209, 310, 311,
        ],
    );
    run(
        &w,
        op(
            "Add",
            &["a", "b"],
            &["c"],
            vec![int_arg("broadcast", 1), int_arg("axis", 1)],
        ),
    )
    .unwrap();
    assert_eq!(get(&w, "c"), want);
    // Trailing size-1 dims of B are ignored: [3,1] at axis 1 is the same.
    run(
        &w,
        op(
            "Add",
            &["a", "b31"],
            &["c"],
            vec![int_arg("broadcast", 1), int_arg("axis", 1)],
        ),
    )
    .unwrap();
    assert_eq!(get(&w, "c"), want);
    // axis_str "C" in "NCHW" is axis 1.
    run(
        &w,
        op(
            "Add",
            &["a", "b"],
            &["c"],
            vec![int_arg("broadcast", 1), string_arg("axis_str", "C")],
        ),
    )
    .unwrap();
    assert_eq!(get(&w, "c"), want);
    // ...and in "NHWC" it is axis 3, out of range for a 3-dim A with 1-dim B.
    let e = run(
        &w,
        op(
            "Add",
            &["a", "b"],
            &["c"],
            vec![
                int_arg("broadcast", 1),
                string_arg("axis_str", "C"),
                string_arg("order", "NHWC"),
            ],
        ),
    )
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Shape);
    // Leading size-1 dims are skipped: [1,2] with the default axis (1) matches A's last dim.
    run(
        &w,
        op("Sub", &["a", "b12"], &["c"], vec![int_arg("broadcast", 1)]),
    )
    .unwrap();
    assert_eq!(
        get(&w, "c"),
        tensor(
            &[2, 3, 2],
            vec![-1000i32, -1999, -998, -1997, -996, -1995, -994, -1993, -992, -1991, -990, -1989]
        )
    );
    // A one-element B is a scalar whatever its shape.
    run(
        &w,
        op("Mul", &["a", "s"], &["c"], vec![int_arg("broadcast", 1)]),
    )
    .unwrap();
    assert_eq!(
        get(&w, "c"),
        tensor(&[2, 3, 2], (0..12).map(|x| x * 5).collect())
    );
    // In place on A is fine.
    run(
        &w,
        op(
            "Add",
            &["a", "b"],
            &["a"],
            vec![int_arg("broadcast", 1), int_arg("axis", 1)],
        ),
    )
    .unwrap();
    assert_eq!(get(&w, "a"), want);
}

#[test]
fn legacy_broadcasting_errors() {
    let w = ws(vec![
        ("a", tensor(&[2, 3], vec![0.0f32; 6])),
        ("b", tensor(&[2], vec![1.0f32, 2.0])),
        ("big", tensor(&[1, 2, 3], vec![0.0f32; 6])),
    ]);
    let bc = || int_arg("broadcast", 1);
    // Suffix match by default: B [2] against A's last dim 3.
    let e = run(&w, op("Add", &["a", "b"], &["c"], vec![bc()])).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Shape);
    assert!(
        e.message.contains("Broadcast dimension mismatch"),
        "{}",
        e.message
    );
    assert_eq!(e.context.blob.as_deref(), Some("b"));
    // axis 0 makes it fit.
    run(
        &w,
        op("Add", &["a", "b"], &["c"], vec![bc(), int_arg("axis", 0)]),
    )
    .unwrap();
    assert_eq!(
        get(&w, "c"),
        tensor(&[2, 3], vec![1.0f32, 1.0, 1.0, 2.0, 2.0, 2.0])
    );
    // Axis out of [0, A.ndim - B.ndim].
    let e = run(
        &w,
        op("Add", &["a", "b"], &["c"], vec![bc(), int_arg("axis", 2)]),
    )
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Shape);
    // B with more dims than A.
    let e = run(&w, op("Add", &["a", "big"], &["c"], vec![bc()])).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Shape);
    // axis and axis_str together, a long axis_str, an unknown letter, a negative axis: construction errors.
    for args in [
        vec![bc(), int_arg("axis", 0), string_arg("axis_str", "N")],
        vec![bc(), string_arg("axis_str", "NC")],
        vec![bc(), string_arg("axis_str", "X")],
        vec![bc(), int_arg("axis", -2)],
    ] {
        let e = run(&w, op("Add", &["a", "b"], &["c"], args)).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{}", e.message);
    }
    // With broadcast 0 the legacy args are ignored (but still read with the field rules).
    let w2 = ws(vec![
        ("a", tensor(&[2], vec![1i32, 2])),
        ("b", tensor(&[2], vec![3i32, 4])),
    ]);
    run(
        &w2,
        op(
            "Add",
            &["a", "b"],
            &["c"],
            vec![int_arg("axis", 7), string_arg("axis_str", "NC")],
        ),
    )
    .unwrap();
    let e = run(
        &w2,
        op("Add", &["a", "b"], &["c"], vec![float_arg("axis", 1.0)]),
    )
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    // In place on B is forbidden with broadcast=1 (at run time, as in Caffe2).
    let e = run(&w2, op("Add", &["a", "b"], &["b"], vec![bc()])).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert_eq!(e.context.blob.as_deref(), Some("b"));
    assert_eq!(get(&w2, "b"), tensor(&[2], vec![3i32, 4]));
}

// ------------------------------------------------------------- dtypes --

#[test]
fn dtype_mismatch_and_unsupported_dtypes() {
    let w = ws(vec![
        ("f", tensor(&[2], vec![1.0f32, 2.0])),
        ("l", tensor(&[2], vec![1i64, 2])),
        ("p", tensor(&[2], vec![true, false])),
        ("u", tensor(&[2], vec![1u8, 2])),
    ]);
    let e = run(&w, op("Add", &["f", "l"], &["c"], vec![])).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Type);
    assert_eq!(e.context.blob.as_deref(), Some("l"));
    assert!(
        e.message.contains("float32") && e.message.contains("int64"),
        "{}",
        e.message
    );
    let e = run(&w, op("Add", &["p", "p"], &["c"], vec![])).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Type);
    assert!(
        e.message.starts_with("Unsupported type of tensor: bool"),
        "{}",
        e.message
    );
    assert_eq!(e.context.blob.as_deref(), Some("p"));
    let e = run(&w, op("LT", &["u", "u"], &["c"], vec![])).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Type);
    let e = run(&w, op("EQ", &["l", "f"], &["c"], vec![])).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Type);
    assert_eq!(e.context.blob.as_deref(), Some("f"));
    // A blob that is not a tensor.
    w.feed("empty", BlobValue::Empty);
    let e = run(&w, op("Mul", &["f", "empty"], &["c"], vec![])).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Type);
    assert_eq!(e.context.blob.as_deref(), Some("empty"));
}

// ------------------------------------------------------------ in place --

#[test]
fn in_place_on_a_and_b() {
    let w = ws(vec![
        ("x", tensor(&[3], vec![1.0f32, 2.0, 3.0])),
        ("y", tensor(&[3], vec![10.0f32, 20.0, 30.0])),
        ("s", Tensor::scalar(2.0f32)),
    ]);
    run(&w, op("Sub", &["x", "y"], &["x"], vec![])).unwrap();
    assert_eq!(get(&w, "x"), tensor(&[3], vec![-9.0f32, -18.0, -27.0]));
    // Output = B keeps the operand order: y = x - y.
    run(&w, op("Sub", &["x", "y"], &["y"], vec![])).unwrap();
    assert_eq!(get(&w, "y"), tensor(&[3], vec![-19.0f32, -38.0, -57.0]));
    // Output = A = B.
    run(&w, op("Add", &["x", "x"], &["x"], vec![])).unwrap();
    assert_eq!(get(&w, "x"), tensor(&[3], vec![-18.0f32, -36.0, -54.0]));
    // A scalar B broadcast into an in-place A.
    run(&w, op("Div", &["x", "s"], &["x"], vec![])).unwrap();
    assert_eq!(get(&w, "x"), tensor(&[3], vec![-9.0f32, -18.0, -27.0]));
    // A scalar A broadcast into an in-place B: y = s * y.
    run(&w, op("Mul", &["s", "y"], &["y"], vec![])).unwrap();
    assert_eq!(get(&w, "y"), tensor(&[3], vec![-38.0f32, -76.0, -114.0]));
}

#[test]
fn in_place_requires_the_result_shape() {
    let w = ws(vec![
        ("s", Tensor::scalar(1i32)),
        ("v", tensor(&[2], vec![1i32, 2])),
    ]);
    let e = run(&w, op("Add", &["s", "v"], &["s"], vec![])).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Shape);
    assert_eq!(e.context.blob.as_deref(), Some("s"));
    assert_eq!(get(&w, "s"), Tensor::scalar(1i32));
    let e = run(&w, op("Add", &["v", "s"], &["s"], vec![])).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Shape);
    assert_eq!(get(&w, "s"), Tensor::scalar(1i32));
}

#[test]
fn in_place_rules_in_schemas() {
    let w = ws(vec![
        ("a", tensor(&[2], vec![1i32, 2])),
        ("b", tensor(&[2], vec![3i32, 4])),
    ]);
    // Div, comparisons and logic ops may not write over B; comparisons not over A either.
    for (ty, out) in [("Div", "b"), ("EQ", "a"), ("GE", "b"), ("Not", "a")] {
        let ins: &[&str] = if ty == "Not" { &["a"] } else { &["a", "b"] };
        let e = run(&w, op(ty, ins, &[out], vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{ty}");
    }
    let w = ws(vec![
        ("p", tensor(&[2], vec![true, false])),
        ("q", tensor(&[2], vec![true, true])),
    ]);
    let e = run(&w, op("Or", &["p", "q"], &["q"], vec![])).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    run(&w, op("Xor", &["p", "q"], &["p"], vec![])).unwrap();
    assert_eq!(get(&w, "p"), tensor(&[2], vec![false, true]));
}

#[test]
fn scalar_in_place_add_reuses_the_buffer() {
    let w = ws(vec![
        ("x", Tensor::scalar(0.0f32)),
        ("one", Tensor::scalar(1.0f32)),
    ]);
    let before = data_ptr(&w, "x");
    run_kernel(&w, &op("Add", &["x", "one"], &["x"], vec![]), 1000);
    assert_eq!(get(&w, "x"), Tensor::scalar(1000.0f32));
    assert_eq!(data_ptr(&w, "x"), before);
}

#[test]
fn separate_output_buffer_is_reused_when_it_fits() {
    let w = ws(vec![
        ("a", tensor(&[2, 2], vec![1i64, 2, 3, 4])),
        ("b", tensor(&[2], vec![10i64, 20])),
    ]);
    let d = op("Add", &["a", "b"], &["c"], vec![]);
    run_kernel(&w, &d, 1);
    let p = data_ptr(&w, "c");
    w.feed("a", BlobValue::Tensor(tensor(&[2, 2], vec![5i64, 6, 7, 8])));
    run_kernel(&w, &d, 1);
    assert_eq!(get(&w, "c"), tensor(&[2, 2], vec![15i64, 26, 17, 28]));
    assert_eq!(data_ptr(&w, "c"), p);
    // An output of another dtype or shape is replaced.
    w.feed("c", BlobValue::Tensor(tensor(&[3], vec![0.0f32; 3])));
    run_kernel(&w, &d, 1);
    assert_eq!(get(&w, "c"), tensor(&[2, 2], vec![15i64, 26, 17, 28]));
}

#[cfg(target_arch = "x86_64")]
#[test]
fn streaming_copy_handles_unaligned_heads_and_tails() {
    for off in 0..9 {
        for len in [0usize, 1, 3, 4, 5, 17, 100] {
            let src: Vec<u32> = (0..len as u32).map(|i| i * 7 + 1).collect();
            let mut dst = vec![0u32; len + off + 3];
            nt::copy(&mut dst[off..off + len], &src);
            nt::fence();
            assert_eq!(&dst[off..off + len], &src[..]);
            assert!(dst[..off].iter().chain(&dst[off + len..]).all(|&x| x == 0));
        }
        let src: Vec<u8> = (0..50u8).collect();
        let mut dst = vec![0u8; 64];
        nt::copy(&mut dst[off..off + 50], &src);
        assert_eq!(&dst[off..off + 50], &src[..]);
        let src: Vec<f64> = (0..21).map(|i| i as f64 * 0.5).collect();
        let mut dst = vec![0f64; 30];
        nt::copy(&mut dst[off..off + 21], &src);
        assert_eq!(&dst[off..off + 21], &src[..]);
    }
}

#[test]
fn streamed_outputs_are_exact() {
    // 2^22 float32 = 16 MiB: separate outputs are written with streaming
    // stores; in-place ones and smaller ones are not. Every path must
    // agree with a plain loop.
    let n = 1usize << 22;
    let a: Vec<f32> = (0..n).map(|i| (i % 1013) as f32 * 0.5).collect();
    let b: Vec<f32> = (0..n).map(|i| (i % 977) as f32 - 3.0).collect();
    let row: Vec<f32> = (0..1000).map(|i| i as f32).collect();
    let w = ws(vec![
        ("a", tensor(&[n], a.clone())),
        ("b", tensor(&[n], b.clone())),
        ("m", tensor(&[n / 1024, 1024], a.clone())),
        ("r", tensor(&[1000], row.clone())),
        (
            "m2",
            tensor(&[n / 1000, 1000], a[..n / 1000 * 1000].to_vec()),
        ),
        ("s", Tensor::scalar(2.0f32)),
    ]);
    assert!(streams::<f32>(n) && !streams::<f32>(n - 1));
    run(&w, op("Add", &["a", "b"], &["c"], vec![])).unwrap();
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    assert_eq!(get(&w, "c"), tensor(&[n], want.clone()));
    // Again into the existing buffer.
    let p = data_ptr(&w, "c");
    run(&w, op("Add", &["a", "b"], &["c"], vec![])).unwrap();
    assert_eq!(data_ptr(&w, "c"), p);
    assert_eq!(get(&w, "c"), tensor(&[n], want));
    run(&w, op("Mul", &["a", "s"], &["d"], vec![])).unwrap();
    assert_eq!(
        get(&w, "d"),
        tensor(&[n], a.iter().map(|x| x * 2.0).collect())
    );
    run(&w, op("LT", &["a", "b"], &["lt"], vec![])).unwrap();
    let lt: Vec<bool> = a.iter().zip(&b).map(|(x, y)| x < y).collect();
    assert_eq!(get(&w, "lt"), tensor(&[n], lt));
    run(&w, op("Sub", &["m2", "r"], &["e"], vec![])).unwrap();
    let e: Vec<f32> = a[..n / 1000 * 1000]
        .iter()
        .enumerate()
        .map(|(i, x)| x - row[i % 1000])
        .collect();
    assert_eq!(get(&w, "e"), tensor(&[n / 1000, 1000], e));
    run(&w, op("Sum", &["a"], &["f"], vec![])).unwrap();
    assert_eq!(get(&w, "f"), tensor(&[n], a.clone()));
    run(&w, op("Cast", &["m"], &["g"], vec![int_arg("to", 10)])).unwrap();
    assert_eq!(
        get(&w, "g"),
        tensor(&[n / 1024, 1024], a.iter().map(|&x| x as i64).collect())
    );
}

// ------------------------------------------------ comparisons and logic --

#[test]
fn comparisons() {
    let w = ws(vec![
        ("a", tensor(&[2, 3], vec![1i32, 2, 3, 4, 5, 6])),
        ("b", tensor(&[3], vec![2i32, 2, 5])),
    ]);
    let cases = [
        ("EQ", [false, true, false, false, false, false]),
        ("NE", [true, false, true, true, true, true]),
        ("LT", [true, false, true, false, false, false]),
        ("LE", [true, true, true, false, false, false]),
        ("GT", [false, false, false, true, true, true]),
        ("GE", [false, true, false, true, true, true]),
    ];
    for (ty, want) in cases {
        run(&w, op(ty, &["a", "b"], &["c"], vec![])).unwrap();
        assert_eq!(get(&w, "c"), tensor(&[2, 3], want.to_vec()), "{ty}");
    }
    // Floats: NaN is unequal to everything, itself included.
    let w = ws(vec![
        ("x", tensor(&[3], vec![f64::NAN, 1.0, -0.0])),
        ("y", tensor(&[3], vec![f64::NAN, f64::NAN, 0.0])),
    ]);
    run(&w, op("EQ", &["x", "y"], &["c"], vec![])).unwrap();
    assert_eq!(get(&w, "c"), tensor(&[3], vec![false, false, true]));
    run(&w, op("NE", &["x", "y"], &["c"], vec![])).unwrap();
    assert_eq!(get(&w, "c"), tensor(&[3], vec![true, true, false]));
    run(&w, op("GE", &["x", "y"], &["c"], vec![])).unwrap();
    assert_eq!(get(&w, "c"), tensor(&[3], vec![false, false, true]));
    // Bools order false < true; legacy broadcasting works for comparisons too.
    let w = ws(vec![
        ("p", tensor(&[2, 2], vec![false, true, false, true])),
        ("q", tensor(&[2], vec![true, false])),
    ]);
    run(
        &w,
        op(
            "LT",
            &["p", "q"],
            &["c"],
            vec![int_arg("broadcast", 1), int_arg("axis", 0)],
        ),
    )
    .unwrap();
    assert_eq!(
        get(&w, "c"),
        tensor(&[2, 2], vec![true, false, false, false])
    );
    // int64 against a scalar.
    let w = ws(vec![
        ("v", tensor(&[3], vec![-1i64, 0, 1])),
        ("z", Tensor::scalar(0i64)),
    ]);
    run(&w, op("GT", &["v", "z"], &["c"], vec![])).unwrap();
    assert_eq!(get(&w, "c"), tensor(&[3], vec![false, false, true]));
}

#[test]
fn logic_ops() {
    let w = ws(vec![
        ("p", tensor(&[4], vec![false, false, true, true])),
        ("q", tensor(&[4], vec![false, true, false, true])),
        ("r", tensor(&[2, 1], vec![true, false])),
    ]);
    run(&w, op("And", &["p", "q"], &["c"], vec![])).unwrap();
    assert_eq!(get(&w, "c"), tensor(&[4], vec![false, false, false, true]));
    run(&w, op("Or", &["p", "q"], &["c"], vec![])).unwrap();
    assert_eq!(get(&w, "c"), tensor(&[4], vec![false, true, true, true]));
    run(&w, op("Xor", &["p", "q"], &["c"], vec![])).unwrap();
    assert_eq!(get(&w, "c"), tensor(&[4], vec![false, true, true, false]));
    run(&w, op("Not", &["p"], &["c"], vec![])).unwrap();
    assert_eq!(get(&w, "c"), tensor(&[4], vec![true, true, false, false]));
    // Broadcast [2,1] with [4] -> [2,4].
    run(&w, op("And", &["r", "q"], &["c"], vec![])).unwrap();
    assert_eq!(
        get(&w, "c"),
        tensor(
            &[2, 4],
            vec![false, true, false, true, false, false, false, false]
        )
    );
    // In place on A.
    run(&w, op("Or", &["p", "q"], &["p"], vec![])).unwrap();
    assert_eq!(get(&w, "p"), tensor(&[4], vec![false, true, true, true]));
    // Bool only.
    let w = ws(vec![("i", tensor(&[2], vec![1i32, 0]))]);
    for (ty, ins) in [("And", &["i", "i"][..]), ("Not", &["i"][..])] {
        let e = run(&w, op(ty, ins, &["c"], vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Type, "{ty}");
        assert_eq!(e.context.blob.as_deref(), Some("i"));
    }
}

// ---------------------------------------------------------------- Sum --

#[test]
fn sum_adds_in_order_and_copies_one_input() {
    let w = ws(vec![
        ("a", tensor(&[2, 2], vec![1.0f32, 2.0, 3.0, 4.0])),
        ("b", tensor(&[2, 2], vec![10.0f32, 20.0, 30.0, 40.0])),
        ("c", tensor(&[2, 2], vec![100.0f32, 200.0, 300.0, 400.0])),
        ("i", tensor(&[3], vec![i64::MAX, 1, 2])),
        ("j", tensor(&[3], vec![1i64, 2, 3])),
    ]);
    run(&w, op("Sum", &["a", "b", "c"], &["y"], vec![])).unwrap();
    assert_eq!(
        get(&w, "y"),
        tensor(&[2, 2], vec![111.0f32, 222.0, 333.0, 444.0])
    );
    run(&w, op("Sum", &["a"], &["y"], vec![])).unwrap();
    assert_eq!(get(&w, "y"), get(&w, "a"));
    run(&w, op("Sum", &["a", "a"], &["y"], vec![])).unwrap();
    assert_eq!(get(&w, "y"), tensor(&[2, 2], vec![2.0f32, 4.0, 6.0, 8.0]));
    run(&w, op("Sum", &["a", "b", "c"], &["a"], vec![])).unwrap();
    assert_eq!(
        get(&w, "a"),
        tensor(&[2, 2], vec![111.0f32, 222.0, 333.0, 444.0])
    );
    run(&w, op("Sum", &["a"], &["a"], vec![])).unwrap();
    assert_eq!(
        get(&w, "a"),
        tensor(&[2, 2], vec![111.0f32, 222.0, 333.0, 444.0])
    );
    // Integers wrap.
    run(&w, op("Sum", &["i", "j", "j"], &["y"], vec![])).unwrap();
    assert_eq!(get(&w, "y"), tensor(&[3], vec![i64::MIN + 1, 5, 8]));
}

#[test]
fn sum_of_more_distinct_inputs_than_a_u16_counts_reads_each_blob() {
    // Input k holds k: a slot index that wrapped at 65,536 would read
    // input 0 (or another early blob) instead, and the output's slot
    // would land on an input's read guard.
    let n = 70_000usize;
    let names: Vec<String> = (0..n).map(|k| format!("x{k}")).collect();
    let w = Workspace::new();
    for (k, name) in names.iter().enumerate() {
        w.feed(name, BlobValue::Tensor(Tensor::scalar(k as i64)));
    }
    let ins: Vec<&str> = names.iter().map(String::as_str).collect();
    run(&w, op("Sum", &ins, &["total"], vec![])).unwrap();
    let expected = (n as i64) * (n as i64 - 1) / 2;
    assert_eq!(get(&w, "total"), Tensor::scalar(expected));
    // In place on input 0, with the last input named twice.
    let mut ins2 = ins.clone();
    ins2.push(ins[n - 1]);
    run(&w, op("Sum", &ins2, &["x0"], vec![])).unwrap();
    assert_eq!(get(&w, "x0"), Tensor::scalar(expected + n as i64 - 1));
}

#[test]
fn sum_errors() {
    let w = ws(vec![
        ("a", tensor(&[2], vec![1i32, 2])),
        ("b", tensor(&[2], vec![1i64, 2])),
        ("c", tensor(&[1, 2], vec![1i32, 2])),
        ("d", tensor(&[2], vec![1i32, 2])),
        ("p", tensor(&[2], vec![true, false])),
    ]);
    let e = run(&w, op("Sum", &["a", "d", "b"], &["y"], vec![])).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Type);
    assert_eq!(e.context.blob.as_deref(), Some("b"));
    assert!(
        e.message.contains("int32") && e.message.contains("int64"),
        "{}",
        e.message
    );
    // Same element count, different shape: no broadcasting, no reshaping.
    let e = run(&w, op("Sum", &["a", "c"], &["a"], vec![])).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Shape);
    assert_eq!(e.context.blob.as_deref(), Some("c"));
    assert_eq!(get(&w, "a"), tensor(&[2], vec![1i32, 2]));
    let e = run(&w, op("Sum", &["p", "p"], &["y"], vec![])).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Type);
    // Only input 0 may be the output.
    let e = run(&w, op("Sum", &["a", "d"], &["d"], vec![])).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    let e = run(&w, op("Sum", &[], &["y"], vec![])).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
}

// -------------------------------------------------------- WeightedSum --

#[test]
fn weighted_sum_values() {
    let w = ws(vec![
        ("x0", tensor(&[2, 2], vec![1.0f32, 2.0, 3.0, 4.0])),
        ("w0", tensor(&[1], vec![2.0f32])),
        ("x1", tensor(&[4], vec![10.0f32, 20.0, 30.0, 40.0])),
        ("w1", Tensor::scalar(0.5f32)),
        ("x2", tensor(&[2, 2], vec![1.0f32, 1.0, 1.0, 1.0])),
        ("w2", tensor(&[1, 1], vec![-3.0f32])),
    ]);
    run(&w, op("WeightedSum", &["x0", "w0"], &["y"], vec![])).unwrap();
    assert_eq!(get(&w, "y"), tensor(&[2, 2], vec![2.0f32, 4.0, 6.0, 8.0]));
    // Y takes X0's shape even though X1 is [4].
    run(
        &w,
        op("WeightedSum", &["x0", "w0", "x1", "w1"], &["y"], vec![]),
    )
    .unwrap();
    assert_eq!(
        get(&w, "y"),
        tensor(&[2, 2], vec![7.0f32, 14.0, 21.0, 28.0])
    );
    run(
        &w,
        op(
            "WeightedSum",
            &["x0", "w0", "x1", "w1", "x2", "w2"],
            &["y"],
            vec![],
        ),
    )
    .unwrap();
    assert_eq!(
        get(&w, "y"),
        tensor(&[2, 2], vec![4.0f32, 11.0, 18.0, 25.0])
    );
    // In place on X0.
    run(
        &w,
        op(
            "WeightedSum",
            &["x0", "w0", "x1", "w1", "x2", "w2"],
            &["x0"],
            vec![],
        ),
    )
    .unwrap();
    assert_eq!(
        get(&w, "x0"),
        tensor(&[2, 2], vec![4.0f32, 11.0, 18.0, 25.0])
    );
    run(&w, op("WeightedSum", &["x0", "w1"], &["x0"], vec![])).unwrap();
    assert_eq!(get(&w, "x0"), tensor(&[2, 2], vec![2.0f32, 5.5, 9.0, 12.5]));
    // An empty X0 gives an empty output.
    let w = ws(vec![
        ("e", tensor(&[0, 3], Vec::<f32>::new())),
        ("w", Tensor::scalar(1.0f32)),
    ]);
    run(&w, op("WeightedSum", &["e", "w", "e", "w"], &["y"], vec![])).unwrap();
    assert_eq!(get(&w, "y").shape(), &[0, 3]);
}

#[test]
fn weighted_sum_errors() {
    let w = ws(vec![
        ("x", tensor(&[2], vec![1.0f32, 2.0])),
        ("w", Tensor::scalar(1.0f32)),
        ("w2", tensor(&[2], vec![1.0f32, 1.0])),
        ("wd", Tensor::scalar(1.0f64)),
        ("x3", tensor(&[3], vec![1.0f32, 2.0, 3.0])),
        ("xd", tensor(&[2], vec![1.0f64, 2.0])),
        ("xi", tensor(&[2], vec![1i32, 2])),
    ]);
    let cases: &[(&[&str], &str, ErrorKind, &str)] = &[
        (&["x", "w", "x"], "y", ErrorKind::InvalidArgument, ""),
        (&["x", "w2"], "y", ErrorKind::Shape, "w2"),
        (&["x", "wd"], "y", ErrorKind::Type, "wd"),
        (&["x", "w", "x3", "w"], "y", ErrorKind::Shape, "x3"),
        (&["x", "w", "xd", "w"], "y", ErrorKind::Type, "xd"),
        (&["xi", "w"], "y", ErrorKind::Type, "xi"),
        (
            &["x", "w", "x3", "w"],
            "x3",
            ErrorKind::InvalidArgument,
            "x3",
        ),
    ];
    for (ins, out, kind, blob) in cases {
        let e = run(&w, op("WeightedSum", ins, &[out], vec![])).unwrap_err();
        assert_eq!(e.kind, *kind, "{ins:?}: {}", e.message);
        if !blob.is_empty() {
            assert_eq!(e.context.blob.as_deref(), Some(*blob), "{ins:?}");
        }
    }
    // A failing in-place call leaves X0 untouched.
    let e = run(
        &w,
        op("WeightedSum", &["x", "w", "x3", "w"], &["x"], vec![]),
    )
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Shape);
    assert_eq!(get(&w, "x"), tensor(&[2], vec![1.0f32, 2.0]));
}

// -------------------------------------------------------------- Scale --

#[test]
fn scale() {
    let w = ws(vec![
        ("x", tensor(&[3], vec![1.0f32, -2.0, 0.5])),
        ("d", tensor(&[2], vec![1.0f64, 3.0])),
        ("i", tensor(&[1], vec![1i32])),
    ]);
    run(
        &w,
        op("Scale", &["x"], &["y"], vec![float_arg("scale", 2.0)]),
    )
    .unwrap();
    assert_eq!(get(&w, "y"), tensor(&[3], vec![2.0f32, -4.0, 1.0]));
    run(&w, op("Scale", &["x"], &["y"], vec![])).unwrap();
    assert_eq!(get(&w, "y"), get(&w, "x"));
    run(
        &w,
        op("Scale", &["x"], &["x"], vec![float_arg("scale", -0.5)]),
    )
    .unwrap();
    assert_eq!(get(&w, "x"), tensor(&[3], vec![-0.5f32, 1.0, -0.25]));
    run(
        &w,
        op("Scale", &["d"], &["d"], vec![float_arg("scale", 0.25)]),
    )
    .unwrap();
    assert_eq!(get(&w, "d"), tensor(&[2], vec![0.25f64, 0.75]));
    let e = run(&w, op("Scale", &["i"], &["y"], vec![])).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Type);
    assert_eq!(e.context.blob.as_deref(), Some("i"));
    // `scale` is a float argument: an int is a field error.
    let e = run(&w, op("Scale", &["x"], &["y"], vec![int_arg("scale", 2)])).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
}

// --------------------------------------------------------------- Cast --

#[test]
fn cast_conversions() {
    let w = ws(vec![
        (
            "f",
            tensor(&[6], vec![1.7f32, -1.7, f32::NAN, 1e10, -1e10, 0.0]),
        ),
        ("l", tensor(&[3], vec![0i64, -5, 300])),
        ("p", tensor(&[2], vec![true, false])),
    ]);
    // float -> int: truncation toward zero; NaN -> 0; out of range saturates.
    run(
        &w,
        op(
            "Cast",
            &["f"],
            &["y"],
            vec![int_arg("to", DataType::Int32 as i64)],
        ),
    )
    .unwrap();
    assert_eq!(
        get(&w, "y"),
        tensor(&[6], vec![1i32, -1, 0, i32::MAX, i32::MIN, 0])
    );
    // Names are accepted in any case.
    run(
        &w,
        op("Cast", &["f"], &["y"], vec![string_arg("to", "bool")]),
    )
    .unwrap();
    assert_eq!(
        get(&w, "y"),
        tensor(&[6], vec![true, true, true, true, true, false])
    );
    run(
        &w,
        op("Cast", &["l"], &["y"], vec![string_arg("to", "FLOAT")]),
    )
    .unwrap();
    assert_eq!(get(&w, "y"), tensor(&[3], vec![0.0f32, -5.0, 300.0]));
    // int -> narrower int wraps: 300 -> 44 (uint8), -5 -> 251.
    run(
        &w,
        op("Cast", &["l"], &["y"], vec![string_arg("to", "UINT8")]),
    )
    .unwrap();
    assert_eq!(get(&w, "y"), tensor(&[3], vec![0u8, 251, 44]));
    run(
        &w,
        op(
            "Cast",
            &["p"],
            &["y"],
            vec![int_arg("to", DataType::Double as i64)],
        ),
    )
    .unwrap();
    assert_eq!(get(&w, "y"), tensor(&[2], vec![1.0f64, 0.0]));
    run(
        &w,
        op("Cast", &["p"], &["y"], vec![string_arg("to", "INT64")]),
    )
    .unwrap();
    assert_eq!(get(&w, "y"), tensor(&[2], vec![1i64, 0]));
    // Same dtype is a copy.
    run(
        &w,
        op("Cast", &["l"], &["y"], vec![string_arg("to", "INT64")]),
    )
    .unwrap();
    assert_eq!(get(&w, "y"), get(&w, "l"));
    // In place, changing the dtype.
    run(
        &w,
        op("Cast", &["l"], &["l"], vec![string_arg("to", "INT16")]),
    )
    .unwrap();
    assert_eq!(get(&w, "l"), tensor(&[3], vec![0i16, -5, 300]));
    run(
        &w,
        op("Cast", &["l"], &["l"], vec![string_arg("to", "INT16")]),
    )
    .unwrap();
    assert_eq!(get(&w, "l"), tensor(&[3], vec![0i16, -5, 300]));
}

#[test]
fn cast_errors() {
    let w = ws(vec![
        ("f", tensor(&[1], vec![1.0f32])),
        ("s", tensor(&[1], vec![b"x".to_vec()])),
    ]);
    let cases: Vec<(Vec<Argument>, ErrorKind)> = vec![
        (vec![], ErrorKind::InvalidArgument),
        (vec![string_arg("to", "NOPE")], ErrorKind::InvalidArgument),
        (vec![int_arg("to", 11)], ErrorKind::InvalidArgument),
        (vec![int_arg("to", 0)], ErrorKind::InvalidArgument),
        (vec![float_arg("to", 1.0)], ErrorKind::InvalidArgument),
        (vec![string_arg("to", "BYTE")], ErrorKind::Type),
    ];
    for (args, kind) in cases {
        let e = run(&w, op("Cast", &["f"], &["y"], args.clone())).unwrap_err();
        assert_eq!(e.kind, kind, "{args:?}: {}", e.message);
    }
    let e = run(
        &w,
        op("Cast", &["s"], &["y"], vec![string_arg("to", "INT32")]),
    )
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Type);
    assert_eq!(e.context.blob.as_deref(), Some("s"));
    let e = run(
        &w,
        op("Cast", &["s"], &["y"], vec![string_arg("to", "STRING")]),
    )
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Type);
}

#[test]
fn cast_to_string_writes_std_to_string_text() {
    let w = ws(vec![
        ("i", tensor(&[2, 2], vec![0i32, -7, 2147483647, 42])),
        ("b", tensor(&[2], vec![true, false])),
        (
            "f",
            tensor(&[4], vec![1.5f32, -0.25, f32::INFINITY, f32::NAN]),
        ),
        ("d", tensor(&[1], vec![1e20f64])),
    ]);
    let strs = |v: &[&str]| v.iter().map(|s| s.as_bytes().to_vec()).collect::<Vec<_>>();
    run(&w, op("Cast", &["i"], &["y"], vec![int_arg("to", 4)])).unwrap();
    assert_eq!(
        get(&w, "y"),
        tensor(&[2, 2], strs(&["0", "-7", "2147483647", "42"]))
    );
    run(
        &w,
        op("Cast", &["b"], &["y"], vec![string_arg("to", "STRING")]),
    )
    .unwrap();
    assert_eq!(get(&w, "y"), tensor(&[2], strs(&["1", "0"])));
    run(
        &w,
        op("Cast", &["f"], &["y"], vec![string_arg("to", "STRING")]),
    )
    .unwrap();
    assert_eq!(
        get(&w, "y"),
        tensor(&[4], strs(&["1.500000", "-0.250000", "inf", "nan"]))
    );
    run(
        &w,
        op("Cast", &["d"], &["d"], vec![string_arg("to", "STRING")]),
    )
    .unwrap();
    assert_eq!(
        get(&w, "d"),
        tensor(&[1], strs(&["100000000000000000000.000000"]))
    );
}

// -------------------------------------------------- layouts and sizes --

#[test]
fn non_standard_layouts() {
    // a = [[0,1,2],[3,4,5]] transposed: [[0,3],[1,4],[2,5]].
    let a = ArrayD::from_shape_vec(IxDyn(&[2, 3]), vec![0i32, 1, 2, 3, 4, 5])
        .unwrap()
        .reversed_axes();
    assert!(!a.is_standard_layout());
    let w = ws(vec![
        ("a", Tensor::from(a.clone())),
        ("b", tensor(&[3, 2], vec![10i32, 20, 30, 40, 50, 60])),
        ("r", tensor(&[2], vec![100i32, 200])),
    ]);
    run(&w, op("Add", &["a", "b"], &["c"], vec![])).unwrap();
    assert_eq!(
        get(&w, "c"),
        tensor(&[3, 2], vec![10i32, 23, 31, 44, 52, 65])
    );
    run(&w, op("Sub", &["b", "a"], &["c"], vec![])).unwrap();
    assert_eq!(
        get(&w, "c"),
        tensor(&[3, 2], vec![10i32, 17, 29, 36, 48, 55])
    );
    run(&w, op("Add", &["a", "r"], &["c"], vec![])).unwrap();
    assert_eq!(
        get(&w, "c"),
        tensor(&[3, 2], vec![100i32, 203, 101, 204, 102, 205])
    );
    run(&w, op("Add", &["a", "r"], &["a"], vec![])).unwrap();
    assert_eq!(
        get(&w, "a"),
        tensor(&[3, 2], vec![100i32, 203, 101, 204, 102, 205])
    );
    w.feed("a", BlobValue::Tensor(Tensor::from(a.clone())));
    run(&w, op("Sum", &["a", "b"], &["a"], vec![])).unwrap();
    assert_eq!(
        get(&w, "a"),
        tensor(&[3, 2], vec![10i32, 23, 31, 44, 52, 65])
    );
    w.feed("a", BlobValue::Tensor(Tensor::from(a.clone())));
    run(
        &w,
        op("Cast", &["a"], &["c"], vec![string_arg("to", "INT64")]),
    )
    .unwrap();
    assert_eq!(get(&w, "c"), tensor(&[3, 2], vec![0i64, 3, 1, 4, 2, 5]));
    // WeightedSum matches elements in row-major order.
    let f = ArrayD::from_shape_vec(IxDyn(&[2, 2]), vec![1.0f32, 2.0, 3.0, 4.0])
        .unwrap()
        .reversed_axes();
    w.feed("f", BlobValue::Tensor(Tensor::from(f)));
    w.feed(
        "g",
        BlobValue::Tensor(tensor(&[4], vec![1.0f32, 1.0, 1.0, 1.0])),
    );
    w.feed("one", BlobValue::Tensor(Tensor::scalar(1.0f32)));
    run(
        &w,
        op("WeightedSum", &["g", "one", "f", "one"], &["y"], vec![]),
    )
    .unwrap();
    assert_eq!(get(&w, "y"), tensor(&[4], vec![2.0f32, 4.0, 3.0, 5.0]));
    run(
        &w,
        op("WeightedSum", &["f", "one", "g", "one"], &["f"], vec![]),
    )
    .unwrap();
    assert_eq!(get(&w, "f"), tensor(&[2, 2], vec![2.0f32, 4.0, 3.0, 5.0]));
}

#[test]
fn large_tensors_take_the_parallel_paths() {
    let n = 3 * PAR_MIN_LEN + 7;
    let a: Vec<f32> = (0..n).map(|i| (i % 1000) as f32).collect();
    let b: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
    let w = ws(vec![
        ("a", tensor(&[n], a.clone())),
        ("b", tensor(&[n], b.clone())),
        ("s", Tensor::scalar(2.0f32)),
        (
            "row",
            tensor(&[7], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]),
        ),
    ]);
    run(&w, op("Add", &["a", "b"], &["c"], vec![])).unwrap();
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    assert_eq!(get(&w, "c"), tensor(&[n], want.clone()));
    run(&w, op("Mul", &["a", "s"], &["c"], vec![])).unwrap();
    assert_eq!(
        get(&w, "c"),
        tensor(&[n], a.iter().map(|x| x * 2.0).collect())
    );
    run(&w, op("Add", &["a", "b"], &["a"], vec![])).unwrap();
    assert_eq!(get(&w, "a"), tensor(&[n], want.clone()));
    run(&w, op("Sub", &["a", "b"], &["a"], vec![])).unwrap();
    assert_eq!(get(&w, "a"), tensor(&[n], a.clone()));
    // A row repeated along a leading dim, separate and in place.
    let m = n / 7 * 7;
    let rows: Vec<f32> = (0..m).map(|i| i as f32).collect();
    w.feed("m", BlobValue::Tensor(tensor(&[m / 7, 7], rows.clone())));
    let want: Vec<f32> = rows
        .iter()
        .enumerate()
        .map(|(i, x)| x - (i % 7 + 1) as f32)
        .collect();
    run(&w, op("Sub", &["m", "row"], &["c"], vec![])).unwrap();
    assert_eq!(get(&w, "c"), tensor(&[m / 7, 7], want.clone()));
    let want_rev: Vec<f32> = rows
        .iter()
        .enumerate()
        .map(|(i, x)| (i % 7 + 1) as f32 - x)
        .collect();
    run(&w, op("Sub", &["row", "m"], &["c"], vec![])).unwrap();
    assert_eq!(get(&w, "c"), tensor(&[m / 7, 7], want_rev));
    run(&w, op("Sub", &["m", "row"], &["m"], vec![])).unwrap();
    assert_eq!(get(&w, "m"), tensor(&[m / 7, 7], want));
    // Comparisons and casts of large tensors.
    run(&w, op("GE", &["b", "s"], &["c"], vec![])).unwrap();
    assert_eq!(
        get(&w, "c"),
        tensor(&[n], b.iter().map(|&x| x >= 2.0).collect())
    );
    run(
        &w,
        op("Cast", &["b"], &["c"], vec![string_arg("to", "INT32")]),
    )
    .unwrap();
    assert_eq!(
        get(&w, "c"),
        tensor(&[n], b.iter().map(|&x| x as i32).collect())
    );
}

#[test]
fn every_schema_is_documented() {
    let all = schemas();
    // 28 forward ops, the gradients of Add, Sub, Mul and Div, Pow and its
    // gradient, WeightedSumGradient, and ElementwiseLinear and its gradient.
    assert_eq!(all.len(), 37);
    for s in &all {
        assert!(!s.doc.is_empty(), "{}", s.name);
    }
}
