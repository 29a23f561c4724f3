//! Shape and type inference over nets (`workspace.InferShapesAndTypes`).
//!
//! Walks the nets' ops in order, asking each op's schema ([`OpSchema::infer`])
//! what its outputs will be from what is known of its inputs, without
//! running anything. The rules are Caffe2's:
//! - an op one of whose inputs is not known at all (not in the map) is
//!   skipped, and so is an op no schema describes: what was known of their
//!   outputs stays;
//! - an op whose schema has no inference, or whose inference fails, makes
//!   its outputs unknown;
//! - an output of a gradient op (`is_gradient_op`) that its inference leaves
//!   unknown and that is named `<x>_grad` takes what is known of `<x>` (a
//!   gradient has its variable's shape);
//! - queue ops (`Enqueue...`/`Dequeue...`) are skipped.
//!
//! Where Caffe2 returned no result at all when one op's inference failed,
//! only that op's outputs become unknown here.

use crate::args::Args;
use crate::ir::NetDef;
use crate::operator::{schema, ShapeInfo};
use std::collections::HashMap;

/// What is known of each blob: `Some` dims and dtype, or `None` (the blob
/// exists, its shape is unknown).
pub type ShapeMap = HashMap<String, Option<ShapeInfo>>;

/// Updates `known` with what the nets' ops write, in order.
pub fn infer_nets(nets: &[NetDef], known: &mut ShapeMap) {
    for net in nets {
        for op in &net.op {
            let ty = op.op_type();
            if ty.contains("Enqueue") || ty.contains("Dequeue") {
                continue;
            }
            let Some(inputs) = op
                .input
                .iter()
                .map(|n| known.get(n).cloned())
                .collect::<Option<Vec<_>>>()
            else {
                continue;
            };
            let Some(s) = schema(ty) else {
                continue;
            };
            let n_out = op.output.len();
            let mut out = match (s.infer, Args::new(ty, &op.arg)) {
                (Some(f), Ok(args)) => match f(&args, &inputs, n_out) {
                    Ok(v) if v.len() == n_out => v,
                    _ => vec![None; n_out],
                },
                _ => vec![None; n_out],
            };
            if op.is_gradient_op.unwrap_or(false) {
                for (o, name) in out.iter_mut().zip(&op.output) {
                    if o.is_none() {
                        if let Some(var) = name.strip_suffix("_grad") {
                            *o = known.get(var).cloned().flatten();
                        }
                    }
                }
            }
            for (name, o) in op.output.iter().zip(out) {
                known.insert(name.clone(), o);
            }
        }
    }
}

/// Helpers for the ops' inference functions.
pub mod rules {
    use crate::error::{Error, Result};
    use crate::operator::ShapeInfo;

    /// Input `i`, known, or `Ok(None)` for the caller to return unknown.
    pub fn known(inputs: &[Option<ShapeInfo>], i: usize) -> Option<&ShapeInfo> {
        inputs.get(i).and_then(|s| s.as_ref())
    }

    /// `axis` (negative counts from the end) as an index below `ndim`.
    pub fn canonical_axis(axis: i64, ndim: usize) -> Result<usize> {
        let n = ndim as i64;
        let a = if axis < 0 { axis + n } else { axis };
        if a < 0 || a >= n {
            return Err(Error::invalid_arg(format!(
                "axis {axis} is out of range for {ndim} dims"
            )));
        }
        Ok(a as usize)
    }

    /// Every output the same as input `i` (or all unknown).
    pub fn same_as_input(
        inputs: &[Option<ShapeInfo>],
        i: usize,
        n_out: usize,
    ) -> Vec<Option<ShapeInfo>> {
        vec![known(inputs, i).cloned(); n_out]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::OperatorDef;
    use crate::tensor::DataType;
    use crate::test_util::{int_arg, op};

    fn net(ops: Vec<OperatorDef>) -> NetDef {
        NetDef {
            op: ops,
            ..Default::default()
        }
    }

    #[test]
    fn walks_ops_in_order_and_keeps_unknowns_apart() {
        let mut known: ShapeMap = HashMap::new();
        known.insert(
            "a".into(),
            Some(ShapeInfo::new(vec![2, 3], DataType::Float)),
        );
        known.insert(
            "b".into(),
            Some(ShapeInfo::new(vec![4, 3], DataType::Float)),
        );
        known.insert("odd".into(), None);
        let n = net(vec![
            op(
                "Concat",
                &["a", "b"],
                &["c", "info"],
                vec![int_arg("axis", 0)],
            ),
            op(
                "Concat",
                &["c", "a"],
                &["d", "info2"],
                vec![int_arg("axis", 0)],
            ),
            // An input nobody knows: skipped, its output stays absent.
            op("Concat", &["missing", "a"], &["e", "info3"], vec![]),
            // A known-but-unknown input: the output is unknown.
            op("Concat", &["odd", "a"], &["f", "info4"], vec![]),
        ]);
        infer_nets(&[n], &mut known);
        assert_eq!(
            known["c"],
            Some(ShapeInfo::new(vec![6, 3], DataType::Float))
        );
        assert_eq!(
            known["info"],
            Some(ShapeInfo::new(vec![2], DataType::Int32))
        );
        assert_eq!(
            known["d"],
            Some(ShapeInfo::new(vec![8, 3], DataType::Float))
        );
        assert!(!known.contains_key("e"));
        assert_eq!(known["f"], None);
    }

    #[test]
    fn a_failing_inference_makes_only_that_ops_outputs_unknown() {
        let mut known: ShapeMap = HashMap::new();
        known.insert(
            "a".into(),
            Some(ShapeInfo::new(vec![2, 3], DataType::Float)),
        );
        known.insert("b".into(), Some(ShapeInfo::new(vec![4], DataType::Float)));
        known.insert(
            "c".into(),
            Some(ShapeInfo::new(vec![1, 3], DataType::Float)),
        );
        let n = net(vec![
            // Ranks differ: this Concat cannot run.
            op(
                "Concat",
                &["a", "b"],
                &["x", "xi"],
                vec![int_arg("axis", 0)],
            ),
            op(
                "Concat",
                &["a", "c"],
                &["y", "yi"],
                vec![int_arg("axis", 0)],
            ),
        ]);
        infer_nets(&[n], &mut known);
        assert_eq!(known["x"], None);
        assert_eq!(
            known["y"],
            Some(ShapeInfo::new(vec![3, 3], DataType::Float))
        );
    }

    #[test]
    fn gradient_outputs_take_their_variables_shape() {
        let mut known: ShapeMap = HashMap::new();
        known.insert(
            "w".into(),
            Some(ShapeInfo::new(vec![5, 2], DataType::Float)),
        );
        known.insert(
            "y_grad".into(),
            Some(ShapeInfo::new(vec![7], DataType::Float)),
        );
        known.insert(
            "sizes".into(),
            Some(ShapeInfo::new(vec![1], DataType::Int32)),
        );
        // Split with a sizes input cannot be inferred; as a gradient op, its
        // `w_grad` output is w's shape.
        let mut g = op(
            "Split",
            &["y_grad", "sizes"],
            &["w_grad"],
            vec![int_arg("axis", 0)],
        );
        g.is_gradient_op = Some(true);
        infer_nets(&[net(vec![g])], &mut known);
        assert_eq!(
            known["w_grad"],
            Some(ShapeInfo::new(vec![5, 2], DataType::Float))
        );
    }
}
