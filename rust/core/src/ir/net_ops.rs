//! The op list of a `core.Net` while it is being built: the ops added since
//! the NetDef was last read (encoded as `NetDef.op` entries, merged into the
//! Python NetDef in one call), which blobs the net defines, and the
//! automatic blob names. Python hands it plain values (names, the name
//! scope, the device option's bytes); nothing here reads Python state.

use std::collections::{HashMap, HashSet};

/// The fields of an OperatorDef that `core.Net` sets for an op made by its op
/// methods in the common case (no device option, engine, control inputs...).
pub struct OpFields<'a> {
    pub op_type: &'a str,
    pub name: &'a str,
    pub inputs: &'a [&'a str],
    pub outputs: &'a [&'a str],
    /// Serialised `Argument` messages, in order.
    pub args: &'a [&'a [u8]],
    /// The serialised `DeviceOption` (the device scope's), if any.
    pub device_option: Option<&'a [u8]>,
}

fn put_len_delimited(out: &mut Vec<u8>, tag: u32, bytes: &[u8]) {
    use prost::encoding::{encode_key, encode_varint, WireType};
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

/// Appends one `NetDef.op` entry (field 2) holding an OperatorDef with
/// `fields`, byte for byte what prost or protobuf would write for it (fields
/// in number order, `name` present even when empty). Encoding a whole net's
/// ops here in one call, instead of building a protobuf message per op in
/// Python, is what makes `core.Net` fast (see `core.Net._flush`).
/// `scratch` is reused between calls.
pub fn append_net_op(out: &mut Vec<u8>, scratch: &mut Vec<u8>, fields: &OpFields<'_>) {
    scratch.clear();
    encode_op_fields(scratch, fields);
    append_net_op_bytes(out, scratch);
}

/// Appends the serialised OperatorDef with `fields` (as [`append_net_op`]
/// writes it, without the `NetDef.op` framing).
pub fn encode_op_fields(out: &mut Vec<u8>, fields: &OpFields<'_>) {
    for s in fields.inputs {
        put_len_delimited(out, 1, s.as_bytes());
    }
    for s in fields.outputs {
        put_len_delimited(out, 2, s.as_bytes());
    }
    put_len_delimited(out, 3, fields.name.as_bytes());
    put_len_delimited(out, 4, fields.op_type.as_bytes());
    for a in fields.args {
        put_len_delimited(out, 5, a);
    }
    if let Some(d) = fields.device_option {
        put_len_delimited(out, 6, d);
    }
}

/// A value of a scalar `Argument` (the fields `core.Net`'s op methods set
/// for a Python int, bool, float, str or bytes).
pub enum ScalarArg<'a> {
    F(f32),
    I(i64),
    S(&'a [u8]),
}

/// Appends the serialised `Argument` named `name` holding `value`, byte for
/// byte what protobuf writes (fields in number order).
pub fn encode_scalar_arg(out: &mut Vec<u8>, name: &str, value: ScalarArg<'_>) {
    use prost::encoding::{encode_key, encode_varint, WireType};
    put_len_delimited(out, 1, name.as_bytes());
    match value {
        ScalarArg::F(f) => {
            encode_key(2, WireType::ThirtyTwoBit, out);
            out.extend_from_slice(&f.to_le_bytes());
        }
        ScalarArg::I(i) => {
            encode_key(3, WireType::Varint, out);
            encode_varint(i as u64, out);
        }
        ScalarArg::S(s) => put_len_delimited(out, 4, s),
    }
}

/// Appends one `NetDef.op` entry (field 2) holding the serialised
/// OperatorDef `op`.
pub fn append_net_op_bytes(out: &mut Vec<u8>, op: &[u8]) {
    put_len_delimited(out, 2, op);
}

/// A value of a list `Argument` (a Python list or tuple of floats, of ints,
/// or of str and bytes). An empty list writes no value field, as protobuf
/// does for an empty repeated field.
pub enum ListArg<'a> {
    Floats(&'a [f32]),
    Ints(&'a [i64]),
    Strings(&'a [&'a [u8]]),
}

/// Appends the serialised `Argument` named `name` holding `value`, byte for
/// byte what protobuf writes (proto2: repeated scalars are not packed).
pub fn encode_list_arg(out: &mut Vec<u8>, name: &str, value: ListArg<'_>) {
    use prost::encoding::{encode_key, encode_varint, WireType};
    put_len_delimited(out, 1, name.as_bytes());
    match value {
        ListArg::Floats(fs) => {
            for f in fs {
                encode_key(5, WireType::ThirtyTwoBit, out);
                out.extend_from_slice(&f.to_le_bytes());
            }
        }
        ListArg::Ints(is) => {
            for &i in is {
                encode_key(6, WireType::Varint, out);
                encode_varint(i as u64, out);
            }
        }
        ListArg::Strings(ss) => {
            for s in ss {
                put_len_delimited(out, 7, s);
            }
        }
    }
}

/// The op list of a net being built (see the module's doc).
///
/// Blob tables: the outputs of the net's ops and its external inputs. When
/// the NetDef is handed out for editing, the owner marks the tables stale
/// ([`NetOps::invalidate`]) and rebuilds them from the NetDef
/// ([`NetOps::reset`]) before the next lookup.
#[derive(Debug, Default, Clone)]
pub struct NetOps {
    /// `NetDef.op` entries not yet merged into the NetDef.
    queued: Vec<u8>,
    queued_ops: usize,
    scratch: Vec<u8>,
    op_outputs: HashSet<String>,
    external_inputs: HashSet<String>,
    stale: bool,
    /// The next `<net>_blob_<n>`.
    next_blob_index: u64,
    /// Per `<net>/<prefix>[:<id>]`: the next `_<k>` suffix to try.
    next_suffix: HashMap<String, u64>,
}

impl NetOps {
    pub fn new() -> Self {
        Self::default()
    }

    /// How many ops are queued.
    pub fn queued(&self) -> usize {
        self.queued_ops
    }

    /// The queued ops as `NetDef.op` entries (to merge into the NetDef),
    /// and how many; the queue is then empty.
    pub fn take(&mut self) -> (Vec<u8>, usize) {
        let n = std::mem::take(&mut self.queued_ops);
        (std::mem::take(&mut self.queued), n)
    }

    /// Queues an op with `fields`; its outputs are then defined.
    pub fn push(&mut self, fields: &OpFields<'_>) {
        append_net_op(&mut self.queued, &mut self.scratch, fields);
        self.queued_ops += 1;
        self.define(fields.outputs.iter().copied());
    }

    /// Queues a serialised OperatorDef writing `outputs`.
    pub fn push_encoded<'a>(&mut self, op: &[u8], outputs: impl IntoIterator<Item = &'a str>) {
        append_net_op_bytes(&mut self.queued, op);
        self.queued_ops += 1;
        self.define(outputs);
    }

    /// Records blobs that an op of the net writes.
    pub fn define<'a>(&mut self, outputs: impl IntoIterator<Item = &'a str>) {
        for o in outputs {
            if !self.op_outputs.contains(o) {
                self.op_outputs.insert(o.to_owned());
            }
        }
    }

    /// Records an external input of the net.
    pub fn add_external_input(&mut self, name: &str) {
        if !self.external_inputs.contains(name) {
            self.external_inputs.insert(name.to_owned());
        }
    }

    /// True if an op of the net writes `name` or it is an external input.
    pub fn is_defined(&self, name: &str) -> bool {
        self.op_outputs.contains(name) || self.external_inputs.contains(name)
    }

    pub fn is_op_output(&self, name: &str) -> bool {
        self.op_outputs.contains(name)
    }

    pub fn is_external_input(&self, name: &str) -> bool {
        self.external_inputs.contains(name)
    }

    /// The tables may no longer match the NetDef (it was handed out).
    pub fn invalidate(&mut self) {
        self.stale = true;
    }

    pub fn is_stale(&self) -> bool {
        self.stale
    }

    /// Rebuilds the tables from the NetDef's op outputs and external inputs.
    pub fn reset<'a, 'b>(
        &mut self,
        op_outputs: impl IntoIterator<Item = &'a str>,
        external_inputs: impl IntoIterator<Item = &'b str>,
    ) {
        self.op_outputs.clear();
        self.external_inputs.clear();
        self.define(op_outputs);
        for e in external_inputs {
            self.add_external_input(e);
        }
        self.stale = false;
    }

    /// The `_<k>` suffixes to try next, by name (see [`NetOps::next_name`]).
    pub fn next_suffixes(&self) -> &HashMap<String, u64> {
        &self.next_suffix
    }

    pub fn set_next_suffixes(&mut self, suffixes: HashMap<String, u64>) {
        self.next_suffix = suffixes;
    }

    pub fn next_blob_index(&self) -> u64 {
        self.next_blob_index
    }

    /// Where `<net>_blob_<n>` names resume (a net made from a NetDef that
    /// has such names already).
    pub fn set_next_blob_index(&mut self, index: u64) {
        self.next_blob_index = index;
    }

    /// Caffe2's automatic blob name for an output of an op of net
    /// `net_name`: with a `prefix` (the op type), `<net>/<prefix>`, or
    /// `<net>/<prefix>_<k>` (k from 2) when `scope` + that name is defined,
    /// each followed by `:<output_id>` if given; without one,
    /// `<net>_blob_<n>`. The name scope is not put in front.
    pub fn next_name(
        &mut self,
        net_name: &str,
        prefix: Option<&str>,
        output_id: Option<&str>,
        scope: &str,
    ) -> String {
        let prefix = match prefix {
            Some(p) if !p.is_empty() => p,
            _ => {
                let name = format!("{net_name}_blob_{}", self.next_blob_index);
                self.next_blob_index += 1;
                return name;
            }
        };
        let base = format!("{net_name}/{prefix}");
        let with_id = |s: String| match output_id {
            Some(id) => format!("{s}:{id}"),
            None => s,
        };
        let key = with_id(base.clone());
        let mut name = key.clone();
        let mut index = self.next_suffix.get(&key).copied().unwrap_or(2);
        let mut scoped = String::new();
        loop {
            scoped.clear();
            scoped.push_str(scope);
            scoped.push_str(&name);
            if !self.is_defined(&scoped) {
                return name;
            }
            name = with_id(format!("{base}_{index}"));
            index += 1;
            self.next_suffix.insert(key.clone(), index);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{decode, encode, Argument, NetDef, OperatorDef};
    use super::*;

    #[test]
    fn net_ops_encode_as_prost_does() {
        let arg = Argument {
            name: Some("broadcast".into()),
            i: Some(1),
            ..Default::default()
        };
        let long = "x".repeat(300); // a two-byte length
        let op = OperatorDef {
            input: vec!["a".into(), long.clone()],
            output: vec!["é".into()],
            name: Some(String::new()),
            r#type: Some("Add".into()),
            arg: vec![arg.clone(), arg.clone()],
            ..Default::default()
        };
        let bare = OperatorDef {
            r#type: Some("Copy".into()),
            ..Default::default()
        };
        let expected = NetDef {
            op: vec![op, bare.clone()],
            ..Default::default()
        };
        let arg_bytes = encode(&arg);
        let mut out = Vec::new();
        let mut scratch = Vec::new();
        append_net_op(
            &mut out,
            &mut scratch,
            &OpFields {
                op_type: "Add",
                name: "",
                inputs: &["a", &long],
                outputs: &["é"],
                args: &[&arg_bytes, &arg_bytes],
                device_option: None,
            },
        );
        append_net_op_bytes(&mut out, &encode(&bare));
        assert_eq!(out, encode(&expected));
        assert_eq!(decode::<NetDef>(&out, "net").unwrap(), expected);
    }

    #[test]
    fn scalar_args_encode_as_prost_does() {
        let cases = [
            (
                ScalarArg::I(-5),
                Argument {
                    i: Some(-5),
                    ..Default::default()
                },
            ),
            (
                ScalarArg::I(0),
                Argument {
                    i: Some(0),
                    ..Default::default()
                },
            ),
            (
                ScalarArg::F(-0.0),
                Argument {
                    f: Some(-0.0),
                    ..Default::default()
                },
            ),
            (
                ScalarArg::F(2.5),
                Argument {
                    f: Some(2.5),
                    ..Default::default()
                },
            ),
            (
                ScalarArg::S(b""),
                Argument {
                    s: Some(vec![]),
                    ..Default::default()
                },
            ),
            (
                ScalarArg::S("é".as_bytes()),
                Argument {
                    s: Some("é".into()),
                    ..Default::default()
                },
            ),
        ];
        for (value, mut want) in cases {
            want.name = Some("k".into());
            let mut out = Vec::new();
            encode_scalar_arg(&mut out, "k", value);
            assert_eq!(out, encode(&want));
        }
    }

    #[test]
    fn list_args_encode_as_prost_does() {
        let floats = [1.5f32, -0.0, f32::INFINITY];
        let ints = [0i64, -1, i64::MAX, 300];
        let strings: [&[u8]; 3] = [b"", b"ab", "é".as_bytes()];
        let cases = [
            (
                ListArg::Floats(&floats),
                Argument {
                    floats: floats.to_vec(),
                    ..Default::default()
                },
            ),
            (
                ListArg::Ints(&ints),
                Argument {
                    ints: ints.to_vec(),
                    ..Default::default()
                },
            ),
            (
                ListArg::Strings(&strings),
                Argument {
                    strings: strings.iter().map(|s| s.to_vec()).collect(),
                    ..Default::default()
                },
            ),
            (ListArg::Ints(&[]), Argument::default()),
        ];
        for (value, mut want) in cases {
            want.name = Some("k".into());
            let mut out = Vec::new();
            encode_list_arg(&mut out, "k", value);
            assert_eq!(out, encode(&want));
        }
    }

    #[test]
    fn the_queue_holds_ops_in_order_with_their_device_option() {
        let device = crate::ir::DeviceOption {
            device_type: Some(0),
            random_seed: Some(7),
            ..Default::default()
        };
        let dev = encode(&device);
        let mut ops = NetOps::new();
        ops.push(&OpFields {
            op_type: "Relu",
            name: "",
            inputs: &["x"],
            outputs: &["y"],
            args: &[],
            device_option: Some(&dev),
        });
        let bare = OperatorDef {
            r#type: Some("Copy".into()),
            output: vec!["z".into()],
            ..Default::default()
        };
        ops.push_encoded(&encode(&bare), ["z"]);
        assert_eq!(ops.queued(), 2);
        let (bytes, n) = ops.take();
        assert_eq!((n, ops.queued()), (2, 0));
        let net: NetDef = decode(&bytes, "net").unwrap();
        let relu = OperatorDef {
            input: vec!["x".into()],
            output: vec!["y".into()],
            name: Some(String::new()),
            r#type: Some("Relu".into()),
            device_option: Some(device),
            ..Default::default()
        };
        assert_eq!(net.op, vec![relu, bare]);
        assert!(ops.is_op_output("y") && ops.is_defined("z") && !ops.is_defined("x"));
        assert!(ops.take().0.is_empty());
    }

    #[test]
    fn tables_are_rebuilt_from_what_the_owner_gives() {
        let mut ops = NetOps::new();
        ops.define(["a"]);
        ops.add_external_input("x");
        assert!(ops.is_defined("a") && ops.is_external_input("x") && !ops.is_op_output("x"));
        ops.invalidate();
        assert!(ops.is_stale());
        ops.reset(["b"], ["y"]);
        assert!(!ops.is_stale());
        assert!(!ops.is_defined("a") && !ops.is_defined("x"));
        assert!(ops.is_op_output("b") && ops.is_external_input("y"));
    }

    #[test]
    fn automatic_names_follow_caffe2s_rule() {
        let mut ops = NetOps::new();
        assert_eq!(ops.next_name("n", None, None, ""), "n_blob_0");
        assert_eq!(ops.next_name("n", Some(""), None, ""), "n_blob_1");
        ops.set_next_blob_index(5);
        assert_eq!(ops.next_name("n", None, None, "s/"), "n_blob_5");
        // Free: the name itself; defined (with the scope): _2, _3, ...
        assert_eq!(ops.next_name("n", Some("Relu"), None, ""), "n/Relu");
        ops.define(["n/Relu", "n/Relu_2"]);
        assert_eq!(ops.next_name("n", Some("Relu"), None, ""), "n/Relu_3");
        // The suffix resumes where it stopped, and only the scoped name counts.
        ops.define(["n/Relu_3"]);
        assert_eq!(ops.next_name("n", Some("Relu"), None, ""), "n/Relu_4");
        assert_eq!(ops.next_name("n", Some("Relu"), None, "s/"), "n/Relu");
        ops.define(["n/Split:1"]);
        assert_eq!(
            ops.next_name("n", Some("Split"), Some("0"), ""),
            "n/Split:0"
        );
        assert_eq!(
            ops.next_name("n", Some("Split"), Some("1"), ""),
            "n/Split_2:1"
        );
    }
}
