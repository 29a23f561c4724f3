//! Recurrent networks: the cells (`cells.rs`: `LSTMUnit`, `GRUUnit`, one
//! timestep over gate pre-activations, and their gradients).

use crate::operator::OpSchema;

pub mod cells;

pub fn schemas() -> Vec<OpSchema> {
    cells::schemas()
}
