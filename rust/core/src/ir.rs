//! The plan IR: Caffe2's protobuf messages, with Caffe2's field names, numbers
//! and proto2 presence rules (an unset optional field is `None`).
//!
//! The wire format is protobuf, so a plan serialised here can be written to a
//! file, read back, shipped to another process, or exchanged with Caffe2.
//! Only the fields the runtime uses are declared; unknown fields are skipped.

use prost::Message;

#[derive(Clone, PartialEq, Message)]
pub struct Segment {
    #[prost(int64, required, tag = "1")]
    pub begin: i64,
    #[prost(int64, required, tag = "2")]
    pub end: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct TensorProto {
    #[prost(int64, repeated, packed = "false", tag = "1")]
    pub dims: Vec<i64>,
    /// Unset means FLOAT (proto2 default); `data_type()` applies it.
    #[prost(int32, optional, tag = "2", default = "1")]
    pub data_type: Option<i32>,
    #[prost(float, repeated, tag = "3")]
    pub float_data: Vec<f32>,
    #[prost(int32, repeated, tag = "4")]
    pub int32_data: Vec<i32>,
    #[prost(bytes = "vec", optional, tag = "5")]
    pub byte_data: Option<Vec<u8>>,
    #[prost(bytes = "vec", repeated, tag = "6")]
    pub string_data: Vec<Vec<u8>>,
    #[prost(string, optional, tag = "7")]
    pub name: Option<String>,
    #[prost(double, repeated, tag = "9")]
    pub double_data: Vec<f64>,
    #[prost(int64, repeated, tag = "10")]
    pub int64_data: Vec<i64>,
    #[prost(message, optional, tag = "11")]
    pub segment: Option<Segment>,
    #[prost(bytes = "vec", optional, tag = "13")]
    pub raw_data: Option<Vec<u8>>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Argument {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(float, optional, tag = "2")]
    pub f: Option<f32>,
    #[prost(int64, optional, tag = "3")]
    pub i: Option<i64>,
    #[prost(bytes = "vec", optional, tag = "4")]
    pub s: Option<Vec<u8>>,
    #[prost(float, repeated, packed = "false", tag = "5")]
    pub floats: Vec<f32>,
    #[prost(int64, repeated, packed = "false", tag = "6")]
    pub ints: Vec<i64>,
    #[prost(bytes = "vec", repeated, tag = "7")]
    pub strings: Vec<Vec<u8>>,
    #[prost(message, optional, tag = "8")]
    pub n: Option<NetDef>,
    #[prost(message, repeated, tag = "9")]
    pub nets: Vec<NetDef>,
    #[prost(message, optional, tag = "10")]
    pub t: Option<TensorProto>,
    #[prost(message, repeated, tag = "11")]
    pub tensors: Vec<TensorProto>,
}

#[derive(Clone, PartialEq, Message)]
pub struct DeviceOption {
    #[prost(int32, optional, tag = "1")]
    pub device_type: Option<i32>,
    #[prost(int32, optional, tag = "2")]
    pub device_id: Option<i32>,
    #[prost(uint32, optional, tag = "3")]
    pub random_seed: Option<u32>,
    #[prost(string, optional, tag = "4")]
    pub node_name: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
pub struct OperatorDef {
    #[prost(string, repeated, tag = "1")]
    pub input: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    pub output: Vec<String>,
    #[prost(string, optional, tag = "3")]
    pub name: Option<String>,
    #[prost(string, optional, tag = "4")]
    pub r#type: Option<String>,
    #[prost(message, repeated, tag = "5")]
    pub arg: Vec<Argument>,
    #[prost(message, optional, tag = "6")]
    pub device_option: Option<DeviceOption>,
    #[prost(string, optional, tag = "7")]
    pub engine: Option<String>,
    #[prost(string, repeated, tag = "8")]
    pub control_input: Vec<String>,
    #[prost(bool, optional, tag = "9")]
    pub is_gradient_op: Option<bool>,
    #[prost(string, optional, tag = "10")]
    pub debug_info: Option<String>,
}

impl OperatorDef {
    pub fn op_type(&self) -> &str {
        self.r#type.as_deref().unwrap_or("")
    }
}

#[derive(Clone, PartialEq, Message)]
pub struct NetDef {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(message, repeated, tag = "2")]
    pub op: Vec<OperatorDef>,
    #[prost(string, optional, tag = "3")]
    pub r#type: Option<String>,
    #[prost(int32, optional, tag = "4")]
    pub num_workers: Option<i32>,
    #[prost(message, optional, tag = "5")]
    pub device_option: Option<DeviceOption>,
    #[prost(message, repeated, tag = "6")]
    pub arg: Vec<Argument>,
    #[prost(string, repeated, tag = "7")]
    pub external_input: Vec<String>,
    #[prost(string, repeated, tag = "8")]
    pub external_output: Vec<String>,
}

impl NetDef {
    pub fn net_name(&self) -> &str {
        self.name.as_deref().unwrap_or("")
    }
}

#[derive(Clone, PartialEq, Message)]
pub struct ExecutionStep {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(message, repeated, tag = "2")]
    pub substep: Vec<ExecutionStep>,
    #[prost(string, repeated, tag = "3")]
    pub network: Vec<String>,
    #[prost(int64, optional, tag = "4")]
    pub num_iter: Option<i64>,
    #[prost(string, optional, tag = "5")]
    pub criteria_network: Option<String>,
    #[prost(bool, optional, tag = "6")]
    pub concurrent_substeps: Option<bool>,
    #[prost(string, optional, tag = "7")]
    pub report_net: Option<String>,
    #[prost(int32, optional, tag = "8")]
    pub report_interval: Option<i32>,
    #[prost(string, optional, tag = "9")]
    pub should_stop_blob: Option<String>,
    #[prost(bool, optional, tag = "10")]
    pub only_once: Option<bool>,
    #[prost(int64, optional, tag = "11")]
    pub run_every_ms: Option<i64>,
    #[prost(bool, optional, tag = "12")]
    pub create_workspace: Option<bool>,
    #[prost(int32, optional, tag = "13")]
    pub num_concurrent_instances: Option<i32>,
}

impl ExecutionStep {
    pub fn step_name(&self) -> &str {
        self.name.as_deref().unwrap_or("")
    }
}

#[derive(Clone, PartialEq, Message)]
pub struct PlanDef {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(message, repeated, tag = "2")]
    pub network: Vec<NetDef>,
    #[prost(message, repeated, tag = "3")]
    pub execution_step: Vec<ExecutionStep>,
}

#[derive(Clone, PartialEq, Message)]
pub struct BlobProto {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub r#type: Option<String>,
    #[prost(message, optional, tag = "3")]
    pub tensor: Option<TensorProto>,
    #[prost(bytes = "vec", optional, tag = "4")]
    pub content: Option<Vec<u8>>,
    #[prost(int32, optional, tag = "6")]
    pub content_num_chunks: Option<i32>,
    #[prost(int32, optional, tag = "7")]
    pub content_chunk_id: Option<i32>,
}

/// How deeply messages may nest: prost's recursion limit when decoding (and
/// protobuf's default, and Python's `proto.MAX_NESTING`). The runtime holds
/// plans built in Rust to the same bound (steps in `plan.rs`, nets inside
/// nets in `net.rs`), so that no recursion of its own runs out of stack.
pub const MAX_NESTING: usize = 100;

/// Decodes a message, turning a malformed buffer into an `InvalidPlan` error.
/// Messages may nest at most 100 levels (prost's recursion limit, which is
/// protobuf's default and what `proto.MAX_NESTING` enforces in Python).
pub fn decode<M: Message + Default>(bytes: &[u8], what: &str) -> crate::error::Result<M> {
    M::decode(bytes).map_err(|e| {
        crate::error::Error::invalid_plan(format!(
            "cannot parse {what}: {}",
            compact_path(&e.to_string())
        ))
    })
}

/// prost names every message on the path to a decoding error
/// ("ExecutionStep.substep: ExecutionStep.substep: ...: recursion limit
/// reached"); runs of one field are shown once with their count, so that a
/// deeply nested input does not make a message of kilobytes.
fn compact_path(message: &str) -> String {
    let mut parts: Vec<(String, usize)> = Vec::new();
    for p in message.split(": ") {
        match parts.last_mut() {
            Some((last, n)) if last == p => *n += 1,
            _ => parts.push((p.to_string(), 1)),
        }
    }
    parts
        .into_iter()
        .map(|(p, n)| if n > 1 { format!("{p} (x{n})") } else { p })
        .collect::<Vec<_>>()
        .join(": ")
}

pub fn encode<M: Message>(m: &M) -> Vec<u8> {
    m.encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presence_survives_a_round_trip() {
        let step = ExecutionStep {
            name: Some("s".into()),
            only_once: Some(false),
            ..Default::default()
        };
        let back: ExecutionStep = decode(&encode(&step), "step").unwrap();
        assert_eq!(back.only_once, Some(false));
        assert_eq!(back.num_iter, None);
        assert!(decode::<PlanDef>(&[0xff, 0xff, 0xff], "plan").is_err());
    }

    #[test]
    fn nesting_is_limited_with_a_short_message() {
        // 150 substeps deep: past the limit, refused by an error that says
        // where in a few words (the recursion is prost's, bounded).
        let mut step = ExecutionStep {
            name: Some("leaf".into()),
            ..Default::default()
        };
        for _ in 0..150 {
            step = ExecutionStep {
                name: Some("s".into()),
                substep: vec![step],
                ..Default::default()
            };
        }
        let e = decode::<ExecutionStep>(&encode(&step), "step").unwrap_err();
        assert!(e.message.contains("recursion limit"), "{}", e.message);
        assert!(
            e.message.contains("ExecutionStep.substep (x"),
            "{}",
            e.message
        );
        assert!(e.message.len() < 200, "{}", e.message);
        // 100 levels below the top are accepted.
        let mut ok = ExecutionStep::default();
        for _ in 0..100 {
            ok = ExecutionStep {
                substep: vec![ok],
                ..Default::default()
            };
        }
        assert!(decode::<ExecutionStep>(&encode(&ok), "step").is_ok());
    }
}
