//! `cargo bench`: the core's performance targets (B1-B4 of the foundation
//! issue), each printed as a ratio against a baseline measured in this run.
//!
//! - B1 dispatch: a net of 1000 scalar `Add` ops; baseline: the same 1000
//!   in-place scalar additions as a plain Rust loop over 0-dim arrays (the
//!   kernel work without the framework). Framework overhead = (net - baseline) / 1000.
//! - B2 loop: an ExecutionStep with num_iter = 1,000,000 over a one-op net;
//!   baseline: the same net run 1,000,000 times from a Rust loop.
//! - B3 instances: a compute-bound body with num_concurrent_instances 1 vs 2.
//! - B4 kernels: `Add` of two 2^24 float32 tensors vs a single-threaded loop
//!   (numpy's `np.add` is single-threaded), both over buffers allocated as
//!   numpy allocates its arrays (huge pages advised before the first touch);
//!   then the same Add over plain `Vec` buffers (4 KiB pages), against a loop
//!   over plain buffers.
//!
//! `cargo bench` runs the ratio report and then criterion's statistics;
//! `cargo bench -- --ratios-only` skips criterion.

use criterion::Criterion;
use ferrocaffe::ir::{Argument, ExecutionStep, NetDef, OperatorDef, PlanDef};
use ferrocaffe::tensor::copy_array;
use ferrocaffe::{BlobValue, CancelToken, Tensor, Workspace};
use ndarray::{ArrayD, IxDyn};
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn op(ty: &str, ins: &[&str], outs: &[&str], args: Vec<Argument>) -> OperatorDef {
    OperatorDef {
        r#type: Some(ty.into()),
        input: ins.iter().map(|s| s.to_string()).collect(),
        output: outs.iter().map(|s| s.to_string()).collect(),
        arg: args,
        ..Default::default()
    }
}

fn ints_arg(name: &str, v: &[i64]) -> Argument {
    Argument {
        name: Some(name.into()),
        ints: v.to_vec(),
        ..Default::default()
    }
}

/// Median wall time of `runs` calls after `warm` warm-up calls.
fn median(warm: usize, runs: usize, mut f: impl FnMut()) -> Duration {
    for _ in 0..warm {
        f();
    }
    let mut v: Vec<Duration> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    v.sort();
    v[v.len() / 2]
}

fn b1_workspace() -> (Arc<Workspace>, &'static str) {
    let ws = Workspace::new();
    ws.feed("x", BlobValue::Tensor(Tensor::scalar(0.0f32)));
    ws.feed("one", BlobValue::Tensor(Tensor::scalar(1.0f32)));
    let ops = (0..1000)
        .map(|_| op("Add", &["x", "one"], &["x"], vec![]))
        .collect();
    let net = NetDef {
        name: Some("chain".into()),
        op: ops,
        ..Default::default()
    };
    ws.create_net(&net, false).unwrap();
    (ws, "chain")
}

/// The kernel work alone: 1000 in-place scalar additions on the same kind
/// of 0-dim arrays the net uses, with nothing of the framework around them.
fn b1_baseline() {
    let mut x = ndarray::ArrayD::from_elem(ndarray::IxDyn(&[]), 0.0f32);
    let one = ndarray::ArrayD::from_elem(ndarray::IxDyn(&[]), 1.0f32);
    for _ in 0..1000 {
        let x = black_box(&mut x);
        *x += black_box(&one);
    }
    black_box(x);
}

fn b2_plan(n: i64) -> PlanDef {
    let net = NetDef {
        name: Some("tick".into()),
        op: vec![op("Iter", &["it"], &["it"], vec![])],
        ..Default::default()
    };
    let step = ExecutionStep {
        name: Some("loop".into()),
        network: vec!["tick".into()],
        num_iter: Some(n),
        ..Default::default()
    };
    PlanDef {
        name: Some("b2".into()),
        network: vec![net],
        execution_step: vec![step],
    }
}

fn b3_plan(instances: i32) -> PlanDef {
    // Each instance: two elementwise products of 128x128 float32 matrices, 1600
    // times. The tensors stay below the kernels' parallel threshold (256K
    // elements), so each instance is single-threaded and the ratio measures
    // instance scaling alone (like single-threaded BLAS in the peers' W4).
    let init = NetDef {
        name: Some("inst_init".into()),
        op: vec![op(
            "ConstantFill",
            &[],
            &["a"],
            vec![
                ints_arg("shape", &[128, 128]),
                Argument {
                    name: Some("value".into()),
                    f: Some(1.0001),
                    ..Default::default()
                },
            ],
        )],
        ..Default::default()
    };
    let body = NetDef {
        name: Some("work".into()),
        op: vec![
            op("Mul", &["a", "a"], &["b"], vec![]),
            op("Mul", &["b", "a"], &["c"], vec![]),
        ],
        ..Default::default()
    };
    let step = |name: &str, nets: &[&str], n: Option<i64>| ExecutionStep {
        name: Some(name.into()),
        network: nets.iter().map(|s| s.to_string()).collect(),
        num_iter: n,
        ..Default::default()
    };
    let inst = ExecutionStep {
        name: Some("inst".into()),
        substep: vec![
            step("init", &["inst_init"], None),
            step("loop", &["work"], Some(1600)),
        ],
        create_workspace: Some(true),
        ..Default::default()
    };
    let par = ExecutionStep {
        name: Some("par".into()),
        substep: vec![inst],
        num_concurrent_instances: Some(instances),
        ..Default::default()
    };
    PlanDef {
        name: Some("b3".into()),
        network: vec![init, body],
        execution_step: vec![par],
    }
}

/// A B4 operand of `n` float32 values: on huge pages (as numpy's arrays
/// are) when `huge`, else a plain `Vec` (4 KiB pages).
fn b4_array(n: usize, zero: bool, huge: bool) -> ArrayD<f32> {
    let v: Vec<f32> = if zero {
        vec![0.0; n]
    } else {
        (0..n).map(|i| (i % 1000) as f32).collect()
    };
    let a = ArrayD::from_shape_vec(IxDyn(&[n]), v).unwrap();
    if huge {
        copy_array(a.view()).expect("the operand fits in memory")
    } else {
        a
    }
}

fn b4_workspace(n: usize, huge: bool) -> Arc<Workspace> {
    let ws = Workspace::new();
    for (name, zero) in [("a", false), ("b", false), ("c", true)] {
        ws.feed(
            name,
            BlobValue::Tensor(Tensor::from(b4_array(n, zero, huge))),
        );
    }
    let net = NetDef {
        name: Some("add".into()),
        op: vec![op("Add", &["a", "b"], &["c"], vec![])],
        ..Default::default()
    };
    ws.create_net(&net, false).unwrap();
    ws
}

fn ratios() {
    let tok = CancelToken::new();
    println!("== ferrocaffe core benchmarks (ratios against baselines measured in this run) ==");

    let (ws, net) = b1_workspace();
    let t_net = median(20, 200, || assert!(ws.run_net(net, 1, &tok).unwrap()));
    let t_base = median(20, 200, b1_baseline);
    let per_op = t_net.as_nanos() as f64 / 1000.0;
    let overhead = (t_net.as_nanos() as f64 - t_base.as_nanos() as f64) / 1000.0;
    println!(
        "B1 dispatch: {per_op:.1} ns/op through the net, {:.1} ns/op plain loop; framework overhead {overhead:.1} ns/op (target <= 100); ratio net/plain = {:.2}",
        t_base.as_nanos() as f64 / 1000.0,
        t_net.as_secs_f64() / t_base.as_secs_f64()
    );

    let n = 1_000_000;
    let ws = Workspace::new();
    ws.feed(
        "it",
        BlobValue::Tensor(Tensor::from_vec(&[1], vec![0i64]).unwrap()),
    );
    let plan = b2_plan(n);
    let t_step = median(1, 5, || assert!(ws.run_plan(&plan, &tok).unwrap()));
    let ws2 = Workspace::new();
    ws2.feed(
        "it",
        BlobValue::Tensor(Tensor::from_vec(&[1], vec![0i64]).unwrap()),
    );
    ws2.create_net(&plan.network[0], false).unwrap();
    let t_direct = median(1, 5, || {
        assert!(ws2.run_net("tick", n as usize, &tok).unwrap())
    });
    println!(
        "B2 loop: {:.1} ns/iteration as an ExecutionStep (target <= 150), {:.1} ns/iteration as a Rust loop over run_net; ratio = {:.2}",
        t_step.as_nanos() as f64 / n as f64,
        t_direct.as_nanos() as f64 / n as f64,
        t_step.as_secs_f64() / t_direct.as_secs_f64()
    );

    let ws = Workspace::new();
    let (p1, p2) = (b3_plan(1), b3_plan(2));
    let mut t1 = Vec::new();
    let mut t2 = Vec::new();
    for _ in 0..5 {
        t1.push(median(0, 1, || assert!(ws.run_plan(&p1, &tok).unwrap())));
        t2.push(median(0, 1, || assert!(ws.run_plan(&p2, &tok).unwrap())));
    }
    t1.sort();
    t2.sort();
    let (t1, t2) = (t1[2], t2[2]);
    println!(
        "B3 instances: 1 instance {:.1} ms, 2 instances {:.1} ms; throughput ratio = {:.2} (target >= 1.8 on 2 cores)",
        t1.as_secs_f64() * 1e3,
        t2.as_secs_f64() * 1e3,
        2.0 * t1.as_secs_f64() / t2.as_secs_f64()
    );

    let n = 1 << 24;
    let gbps = |t: Duration| 3.0 * 4.0 * n as f64 / t.as_secs_f64() / 1e9;
    for huge in [true, false] {
        let ws = b4_workspace(n, huge);
        let (a, b, mut c) = (
            b4_array(n, false, huge),
            b4_array(n, false, huge),
            b4_array(n, true, huge),
        );
        let (a, b) = (a.as_slice().unwrap(), b.as_slice().unwrap());
        let c = c.as_slice_mut().unwrap();
        // Interleaved, so that noise from other processes hits both alike.
        let (mut t_add, mut t_loop) = (Vec::new(), Vec::new());
        for _ in 0..5 {
            t_add.push(median(1, 5, || {
                assert!(ws.run_net("add", 1, &tok).unwrap())
            }));
            t_loop.push(median(1, 5, || {
                for ((c, a), b) in c.iter_mut().zip(a).zip(b) {
                    *c = a + b;
                }
                black_box(&c);
            }));
        }
        t_add.sort();
        t_loop.sort();
        let (t_add, t_loop) = (t_add[2], t_loop[2]);
        println!(
            "B4 kernels ({}): Add of 2^24 float32 {:.2} ms ({:.1} GB/s), single-thread loop {:.2} ms ({:.1} GB/s); ratio = {:.2}{}",
            if huge {
                "huge pages, as numpy's arrays"
            } else {
                "plain Vec buffers, 4 KiB pages"
            },
            t_add.as_secs_f64() * 1e3,
            gbps(t_add),
            t_loop.as_secs_f64() * 1e3,
            gbps(t_loop),
            t_loop.as_secs_f64() / t_add.as_secs_f64(),
            if huge {
                " (target >= 1.6; numpy's np.add is this loop: compare with benches/run.py)"
            } else {
                ""
            }
        );
    }
}

fn criterion_benches(c: &mut Criterion) {
    let tok = CancelToken::new();
    let (ws, net) = b1_workspace();
    c.bench_function("B1 net of 1000 scalar Add", |b| {
        b.iter(|| ws.run_net(net, 1, &tok).unwrap())
    });
    c.bench_function("B1 baseline: 1000 scalar adds in Rust", |b| {
        b.iter(b1_baseline)
    });
    let ws = Workspace::new();
    ws.feed(
        "it",
        BlobValue::Tensor(Tensor::from_vec(&[1], vec![0i64]).unwrap()),
    );
    let plan = b2_plan(10_000);
    c.bench_function("B2 ExecutionStep num_iter=10000", |b| {
        b.iter(|| ws.run_plan(&plan, &tok).unwrap())
    });
    let ws = b4_workspace(1 << 24, true);
    let mut g = c.benchmark_group("B4");
    g.sample_size(10);
    g.bench_function("Add 2^24 float32", |b| {
        b.iter(|| ws.run_net("add", 1, &tok).unwrap())
    });
    g.finish();
}

fn main() {
    ratios();
    if std::env::args().any(|a| a == "--ratios-only") {
        return;
    }
    let mut c = Criterion::default()
        .configure_from_args()
        .measurement_time(Duration::from_secs(3));
    criterion_benches(&mut c);
    c.final_summary();
}
