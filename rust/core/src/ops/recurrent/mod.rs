//! Recurrent networks: the cells (`cells.rs`: `LSTMUnit`, `GRUUnit`, one
//! timestep over gate pre-activations, and their gradients) and the op that
//! runs a step net over a sequence (`network.rs`: `RecurrentNetwork`, its
//! gradient and the internal link and accumulation ops).

use crate::operator::OpSchema;

pub mod cells;
pub mod network;

pub use network::StepWorkspaces;

pub fn schemas() -> Vec<OpSchema> {
    let mut v = cells::schemas();
    v.extend(network::schemas());
    v
}
