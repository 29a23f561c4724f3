//! The execution-step scheduler (filled in next).
use crate::{cancel::CancelToken, error::Result, ir::PlanDef, workspace::Workspace};
use std::sync::Arc;
pub fn run_plan(_ws: &Arc<Workspace>, _plan: &PlanDef, _c: &CancelToken) -> Result<bool> { Ok(true) }
