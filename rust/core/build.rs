//! Generates the Rust types of `proto/caffe2.proto` (the one copy of the
//! schema) and a serialised `FileDescriptorSet` of it, which the bindings hand
//! to Python to make its protobuf classes. protox is a pure-Rust protobuf
//! compiler, so no `protoc` binary is needed.

use prost::Message;
use std::path::PathBuf;

fn main() {
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap()).join("proto");
    let file = dir.join("caffe2.proto");
    println!("cargo:rerun-if-changed={}", file.display());
    let fds = protox::compile([&file], [&dir]).unwrap_or_else(|e| panic!("{e:?}"));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap());
    std::fs::write(out.join("caffe2.fds"), fds.encode_to_vec()).unwrap();
    prost_build::Config::new()
        .compile_fds(fds)
        .unwrap_or_else(|e| panic!("{e}"));
}
