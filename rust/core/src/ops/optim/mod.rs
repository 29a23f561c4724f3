//! The optimizers (issue 14 and after), one file per rule family, all on
//! float32 state as Caffe2's CPU kernels (FP16MomentumSGDUpdate on float16
//! data): `lr.rs` (LearningRate, Lars), `sgd.rs` (the momentum updates,
//! YellowFin), `adam.rs`, `adagrad.rs` (Adagrad, its sparse and row-wise
//! forms, DecayAdagrad, RowWiseCounter), `adaptive.rs` (RmsProp, Adadelta,
//! Wngrad, Storm), `ftrl.rs`; `common.rs` holds what they share. The
//! sparse updates change the rows at the indices, in order (a repeated
//! index updates its row twice). The weight fillers (XavierFill,
//! MSRAFill) are in `fill.rs`.

pub mod adagrad;
pub mod adam;
pub mod adaptive;
mod common;
pub mod ftrl;
pub mod lr;
pub mod sgd;

pub fn schemas() -> Vec<crate::operator::OpSchema> {
    let mut v = lr::schemas();
    v.extend(sgd::schemas());
    v.extend(adam::schemas());
    v.extend(adagrad::schemas());
    v.extend(adaptive::schemas());
    v.extend(ftrl::schemas());
    v
}
