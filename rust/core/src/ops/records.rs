//! PackRecords and UnPackRecords: a dataset (one tensor per field, in
//! Caffe2's schema convention, see `dataset.rs`) cut into its records and
//! joined back.
//!
//! Caffe2 packed into a 1-D tensor whose elements were shared pointers to
//! each record's tensors (or, with `pack_to_single_shared_ptr`, one pointer
//! to all of them). Tensors here hold plain values only, so the packed form
//! is a runtime object blob, [`PackedRecords`]: the records, each an
//! immutable list of tensors, shared (not copied) when the object is. Both
//! of Caffe2's layouts become this one object, and UnPackRecords takes it.
//! Like Caffe2's pointer tensors it cannot be saved. Ops that took the
//! packed tensor as an ordinary one (Gather, Slice, ...) do not take it.

use super::dataset::{fields_arg, split_records};
use super::kit::kernel;
use crate::arg;
use crate::blob::{BlobObject, BlobValue};
use crate::error::{Error, Result};
use crate::operator::{OpDefCtx, OpSchema, Operator, MANY};
use crate::tensor::{DataType, Tensor};
use std::sync::Arc;

const FIELDS: crate::operator::ArgDoc = arg!(
    "fields",
    "strings",
    "[]",
    "the dataset's field names in the CreateTreeCursor convention, e.g. [\"label\", \"items:lengths\", \"items:values\"]"
);

pub fn schemas() -> Vec<OpSchema> {
    vec![
        OpSchema::new("PackRecords", pack_records)
            .inputs(1, MANY)
            .outputs(1, 1)
            .args(&[
                FIELDS,
                arg!(
                    "pack_to_single_shared_ptr",
                    "int",
                    "0",
                    "Caffe2's choice of layout for the packed pointers; both give the same PackedRecords here"
                ),
            ])
            .doc(
                "Inputs field_1..field_n (one per name in `fields`), output the dataset's records packed into one \
                 PackedRecords blob: record k holds each field's rows for top-level entry k. UnPackRecords reverses it.",
            ),
        OpSchema::new("UnPackRecords", unpack_records)
            .inputs(1, MANY)
            .outputs(1, MANY)
            .args(&[FIELDS])
            .doc(
                "Inputs (packed[, prototype_1..prototype_n]), outputs field_1..field_n: the records joined back along \
                 dim 0. The dtypes and inner shapes come from the first record, or from the prototype tensors (needed \
                 to unpack zero records). A plain tensor input (one input, one output) is copied through.",
            ),
    ]
}

/// The records of a packed dataset (Caffe2's tensor of
/// `SharedTensorVectorPtr`): record k holds one tensor per field.
#[derive(Debug, Default)]
pub struct PackedRecords(pub Vec<Arc<[Tensor]>>);

impl BlobObject for PackedRecords {
    fn kind_name(&self) -> &'static str {
        "PackedRecords"
    }
}

fn pack_records(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let fields = fields_arg(ctx)?;
    if ctx.num_inputs() != fields.len() {
        return Err(ctx.bad_arg(format!(
            "there should be one input per field: {} fields, {} inputs",
            fields.len(),
            ctx.num_inputs()
        )));
    }
    ctx.args.i64("pack_to_single_shared_ptr", 0)?;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let records = {
            let tensors = (0..fields.len())
                .map(|i| l.tensor(i))
                .collect::<Result<Vec<_>>>()?;
            let names: Vec<&str> = (0..fields.len()).map(|i| l.input_name(i)).collect();
            split_records(&fields, &tensors, &names)?
        };
        let packed = PackedRecords(records.into_iter().map(Arc::from).collect());
        *l.output(0) = BlobValue::Object(Arc::new(packed));
        Ok(true)
    }))
}

fn unpack_records(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let fields = fields_arg(ctx)?;
    let (ni, no) = (ctx.num_inputs(), ctx.num_outputs());
    if ni > 1 && (fields.len() != ni - 1 || fields.len() != no) {
        return Err(ctx.bad_arg(format!(
            "with prototypes there should be one prototype input and one output per field: {} fields, {} \
             prototypes, {no} outputs",
            fields.len(),
            ni - 1
        )));
    }
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let packed_name = l.input_name(0).to_string();
        let outs = {
            let packed = match l.input(0) {
                BlobValue::Tensor(t) if ni == 1 && no == 1 => {
                    // Caffe2 let a plain tensor through unchanged.
                    vec![t.clone()]
                }
                v => {
                    let packed = v
                        .object_ref::<PackedRecords>("PackedRecords (made by PackRecords)")
                        .map_err(|e| e.with_blob(&packed_name))?;
                    // Each output's dtype and row shape.
                    let protos: Vec<(DataType, Vec<usize>, String)> = if ni == 1 {
                        let Some(first) = packed.0.first() else {
                            return Err(Error::invalid_arg(
                                "unpacking empty record without shape will leave output blobs in undefined state: \
                                 give prototype tensors as inputs",
                            )
                            .with_blob(&packed_name));
                        };
                        if first.len() != fields.len() || first.len() != no {
                            return Err(Error::invalid_arg(format!(
                                "the records hold {} fields, but the op has {} fields and {no} outputs",
                                first.len(),
                                fields.len()
                            ))
                            .with_blob(&packed_name));
                        }
                        first
                            .iter()
                            .map(|t| (t.dtype(), t.shape().to_vec(), packed_name.clone()))
                            .collect()
                    } else {
                        (1..ni)
                            .map(|i| {
                                let t = l.tensor(i)?;
                                Ok((t.dtype(), t.shape().to_vec(), l.input_name(i).to_string()))
                            })
                            .collect::<Result<_>>()?
                    };
                    let mut outs = protos
                        .iter()
                        .map(|(dtype, shape, name)| {
                            if shape.is_empty() {
                                return Err(Error::shape(
                                    "the fields must be at least 1-D, got a 0-dim tensor",
                                )
                                .with_blob(name));
                            }
                            let mut empty = shape.clone();
                            empty[0] = 0;
                            Tensor::zeros(*dtype, &empty)
                        })
                        .collect::<Result<Vec<_>>>()?;
                    for (k, record) in packed.0.iter().enumerate() {
                        if record.len() != no {
                            return Err(Error::invalid_arg(format!(
                                "record {k} holds {} fields, expected {no}",
                                record.len()
                            ))
                            .with_blob(&packed_name));
                        }
                        for (j, (out, t)) in outs.iter_mut().zip(record.iter()).enumerate() {
                            out.append_rows(t).map_err(|e| {
                                Error::new(
                                    e.kind,
                                    format!(
                                        "record {k}, field {j} ('{}'): {}",
                                        fields[j], e.message
                                    ),
                                )
                                .with_blob(&packed_name)
                            })?;
                        }
                    }
                    outs
                }
            };
            packed
        };
        for (j, t) in outs.into_iter().enumerate() {
            l.set_output(j, t);
        }
        Ok(true)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cancel::CancelToken;
    use crate::error::ErrorKind;
    use crate::ir::OperatorDef;
    use crate::test_util::{feed, get, i32s, i64s, int_arg, op, strings_arg, strs};
    use crate::workspace::Workspace;

    fn run(ws: &Arc<Workspace>, def: &OperatorDef) -> Result<bool> {
        ws.run_operator_once(def, &CancelToken::new())
    }

    /// Three records: (label, items):
    ///   0: 1.5, [10, 11]   1: 2.5, []   2: 3.5, [12]
    /// with "names" a per-record string.
    const FIELDS: [&str; 4] = ["label", "items:lengths", "items:values", "name"];
    fn dataset(ws: &Workspace) -> Vec<Tensor> {
        let data = vec![
            Tensor::from_vec(&[3, 1], vec![1.5f32, 2.5, 3.5]).unwrap(),
            i32s(&[2, 0, 1]),
            i64s(&[10, 11, 12]),
            strs(&["a", "b", "c"]),
        ];
        for (f, t) in FIELDS.iter().zip(&data) {
            feed(ws, f, t.clone());
        }
        data
    }
    fn pack(ws: &Arc<Workspace>) -> Result<bool> {
        run(
            ws,
            &op(
                "PackRecords",
                &FIELDS,
                &["packed"],
                vec![strings_arg("fields", &FIELDS)],
            ),
        )
    }
    fn unpack_def(ins: &[&str]) -> OperatorDef {
        let outs: Vec<String> = FIELDS.iter().map(|f| format!("out/{f}")).collect();
        let outs: Vec<&str> = outs.iter().map(|s| s.as_str()).collect();
        op(
            "UnPackRecords",
            ins,
            &outs,
            vec![strings_arg("fields", &FIELDS)],
        )
    }

    #[test]
    fn pack_cuts_records_and_unpack_joins_them_back() {
        let ws = Workspace::new();
        let data = dataset(&ws);
        pack(&ws).unwrap();
        let packed = ws.fetch("packed").unwrap();
        let records = &packed
            .object_ref::<PackedRecords>("PackedRecords")
            .unwrap()
            .0;
        assert_eq!(records.len(), 3);
        // Record 1: label [[2.5]], no items, name ["b"].
        assert_eq!(
            records[1].to_vec(),
            vec![
                Tensor::from_vec(&[1, 1], vec![2.5f32]).unwrap(),
                i32s(&[0]),
                i64s(&[]),
                strs(&["b"])
            ]
        );
        assert_eq!(records[0][2], i64s(&[10, 11]));
        assert_eq!(records[2][2], i64s(&[12]));
        run(&ws, &unpack_def(&["packed"])).unwrap();
        for (f, want) in FIELDS.iter().zip(&data) {
            assert_eq!(&get(&ws, &format!("out/{f}")), want, "{f}");
        }
        // Prototypes give the shapes; here they agree with the records.
        run(
            &ws,
            &unpack_def(&["packed", "label", "items:lengths", "items:values", "name"]),
        )
        .unwrap();
        assert_eq!(get(&ws, "out/items:values"), data[2]);
    }

    #[test]
    fn zero_records_unpack_only_with_prototypes() {
        let ws = Workspace::new();
        feed(
            &ws,
            "label",
            Tensor::from_vec(&[0, 1], Vec::<f32>::new()).unwrap(),
        );
        feed(&ws, "items:lengths", i32s(&[]));
        feed(&ws, "items:values", i64s(&[]));
        feed(&ws, "name", strs(&[]));
        pack(&ws).unwrap();
        let e = run(&ws, &unpack_def(&["packed"])).unwrap_err();
        assert_eq!(
            (e.kind, e.context.blob.as_deref()),
            (ErrorKind::InvalidArgument, Some("packed"))
        );
        assert!(e.message.contains("without shape"), "{e}");
        run(
            &ws,
            &unpack_def(&["packed", "label", "items:lengths", "items:values", "name"]),
        )
        .unwrap();
        assert_eq!(
            get(&ws, "out/label"),
            Tensor::from_vec(&[0, 1], Vec::<f32>::new()).unwrap()
        );
        assert_eq!(get(&ws, "out/name"), strs(&[]));
    }

    #[test]
    fn a_plain_tensor_passes_through() {
        let ws = Workspace::new();
        feed(&ws, "t", i64s(&[4, 5]));
        run(&ws, &op("UnPackRecords", &["t"], &["u"], vec![])).unwrap();
        assert_eq!(get(&ws, "u"), i64s(&[4, 5]));
    }

    #[test]
    fn bad_packs_and_unpacks_are_typed_errors() {
        let ws = Workspace::new();
        dataset(&ws);
        // Inconsistent lengths: items:lengths asks for 4 values, there are 3.
        feed(&ws, "items:lengths", i32s(&[2, 0, 2]));
        let e = pack(&ws).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Shape, "{e}");
        feed(
            &ws,
            "items:lengths",
            Tensor::from_vec(&[3], vec![2i64, 0, 1]).unwrap(),
        );
        let e = pack(&ws).unwrap_err();
        assert_eq!(
            (e.kind, e.context.blob.as_deref()),
            (ErrorKind::Type, Some("items:lengths")),
            "{e}"
        );
        dataset(&ws);
        pack(&ws).unwrap();
        // Prototypes that disagree with the records.
        feed(
            &ws,
            "proto",
            Tensor::from_vec(&[0, 2], Vec::<f32>::new()).unwrap(),
        );
        let e = run(
            &ws,
            &unpack_def(&["packed", "proto", "items:lengths", "items:values", "name"]),
        )
        .unwrap_err();
        assert_eq!(
            (e.kind, e.context.blob.as_deref()),
            (ErrorKind::Shape, Some("packed")),
            "{e}"
        );
        assert!(e.message.contains("record 0, field 0 ('label')"), "{e}");
        feed(
            &ws,
            "proto",
            Tensor::from_vec(&[0, 1], Vec::<f64>::new()).unwrap(),
        );
        let e = run(
            &ws,
            &unpack_def(&["packed", "proto", "items:lengths", "items:values", "name"]),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Type, "{e}");
        // Not packed records.
        feed(&ws, "x", Tensor::scalar(1i32));
        let e = run(&ws, &unpack_def(&["x"])).unwrap_err();
        assert_eq!(
            (e.kind, e.context.blob.as_deref()),
            (ErrorKind::Type, Some("x")),
            "{e}"
        );
        // Wrong number of outputs for the records.
        let e = run(
            &ws,
            &op(
                "UnPackRecords",
                &["packed"],
                &["o"],
                vec![strings_arg("fields", &["label"])],
            ),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
        // A lengths field after the fields of its domain.
        let bad = ["a:b:lengths", "a:lengths", "a:b:values", "y"];
        let e = run(
            &ws,
            &op(
                "PackRecords",
                &FIELDS,
                &["p"],
                vec![strings_arg("fields", &bad)],
            ),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
        assert!(
            e.message.contains("depends on a field defined after it"),
            "{e}"
        );
        // Construction errors.
        for (def, msg) in [
            (
                op(
                    "PackRecords",
                    &["label"],
                    &["p"],
                    vec![strings_arg("fields", &FIELDS)],
                ),
                "one input per field",
            ),
            (
                op(
                    "UnPackRecords",
                    &["packed", "label"],
                    &["o", "p"],
                    vec![strings_arg("fields", &["a", "b"])],
                ),
                "one prototype input",
            ),
            (
                op(
                    "PackRecords",
                    &FIELDS,
                    &["p"],
                    vec![strings_arg("fields", &FIELDS), int_arg("pack_to_single", 1)],
                ),
                "unknown argument",
            ),
        ] {
            let e = crate::operator::create_operator(&def, &ws)
                .err()
                .expect("should fail");
            assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
            assert!(e.message.contains(msg), "{msg}: {e}");
        }
        // Packed records cannot be saved (Caffe2's pointers could not be either).
        let e = crate::storage::serialize_blob("packed", &ws.fetch("packed").unwrap()).unwrap_err();
        assert!(e.message.contains("cannot be saved"), "{e}");
    }
}
