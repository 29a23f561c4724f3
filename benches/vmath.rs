//! `cargo bench --bench vmath`: the float32 transcendental functions of
//! issue 30 (`ferrocaffe::vmath`), in ns per element over a 2^20-element
//! slice (4 MiB, L2/L3-sized), against baselines measured in the same run,
//! interleaved (medians of 9 rounds): a plain copy of the slice (memory
//! traffic alone) and std's scalar float32 functions (libm's `expf`,
//! `tanhf`, and sigmoid as `1 / (1 + expf(-x))`) over the same slice, and
//! the exp-based tanh that Eigen's rational function replaced.
//! `cargo bench --bench vmath -- --ratios-only` skips criterion.

use criterion::Criterion;
use ferrocaffe::vmath;
use std::hint::black_box;
use std::time::{Duration, Instant};

const N: usize = 1 << 20;

fn input() -> Vec<f32> {
    // Values spread over [-10, 10] (where tanh and sigmoid vary), fixed.
    (0..N)
        .map(|i| ((i as u64 * 2_654_435_761) % 20_000) as f32 * 1e-3 - 10.0)
        .collect()
}

fn time(f: &mut dyn FnMut()) -> Duration {
    let t = Instant::now();
    f();
    t.elapsed()
}

fn std_exp(x: &[f32], y: &mut [f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y = x.exp();
    }
}

fn std_tanh(x: &[f32], y: &mut [f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y = x.tanh();
    }
}

fn std_sigmoid(x: &[f32], y: &mut [f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y = 1.0 / (1.0 + (-x).exp());
    }
}

/// The candidate tanh that Eigen's rational function replaced (1.3 ulp):
/// an odd polynomial below |x| = 0.625, else 1 - 2 / (e^2|x| + 1) through
/// `vmath::exp`, on the same widest vectors.
fn tanh_via_exp(x: &[f32], y: &mut [f32]) {
    #[inline(always)]
    fn one(x: f32) -> f32 {
        let a = x.abs();
        let t = a * a;
        let p = (-5.718_962_8e-3f32).mul_add(t, 2.065_312_5e-2);
        let p = p.mul_add(t, -5.374_466e-2);
        let p = p.mul_add(t, 1.333_151_3e-1);
        let p = p.mul_add(t, -3.333_328_7e-1);
        let small = a.mul_add(t * p, a);
        let big = 1.0 - 2.0 / (vmath::exp(a + a) + 1.0);
        let y = if a < 0.625 { small } else { big };
        y.copysign(x)
    }
    vmath::wide(
        #[inline(always)]
        || {
            for (y, &x) in y.iter_mut().zip(x) {
                *y = one(x);
            }
        },
    )
}

fn copy(x: &[f32], y: &mut [f32]) {
    y.copy_from_slice(x);
}

type SliceFn = fn(&[f32], &mut [f32]);

const CASES: &[(&str, SliceFn)] = &[
    ("copy (baseline)", copy),
    ("vmath::exp", vmath::exp_slice),
    ("std f32::exp", std_exp),
    ("vmath::sigmoid", vmath::sigmoid_slice),
    ("std 1/(1+exp(-x))", std_sigmoid),
    ("vmath::tanh", vmath::tanh_slice),
    ("tanh via vmath::exp", tanh_via_exp),
    ("std f32::tanh", std_tanh),
];

fn ratios() {
    let x = input();
    let mut y = vec![0.0f32; N];
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); CASES.len()];
    for _ in 0..9 {
        for (i, (_, f)) in CASES.iter().enumerate() {
            times[i].push(time(&mut || {
                f(black_box(&x), black_box(&mut y));
            }));
        }
    }
    println!(
        "== vmath: ns per float32 element over 2^20 elements (medians of 9 interleaved rounds) =="
    );
    let ns = |t: &mut Vec<Duration>| {
        t.sort();
        t[t.len() / 2].as_nanos() as f64 / N as f64
    };
    let base = ns(&mut times[0]);
    for (i, (name, _)) in CASES.iter().enumerate() {
        let v = ns(&mut times[i]);
        println!("{name:<20} {v:7.3} ns/element  ({:.1}x the copy)", v / base);
    }
}

fn criterion_benches(c: &mut Criterion) {
    let x = input();
    let mut y = vec![0.0f32; N];
    let mut g = c.benchmark_group("vmath 2^20 float32");
    g.sample_size(20);
    for (name, f) in CASES {
        g.bench_function(*name, |b| b.iter(|| f(black_box(&x), black_box(&mut y))));
    }
    g.finish();
}

fn main() {
    ratios();
    if std::env::args().any(|a| a == "--ratios-only") {
        return;
    }
    let mut c = Criterion::default()
        .configure_from_args()
        .measurement_time(Duration::from_secs(2));
    criterion_benches(&mut c);
    c.final_summary();
}
