//! `gemm-bench M N K REPS THREADS`: times C = A * B (float32, row-major) with
//! `matrixmultiply` (single-threaded, as the core's kernels call it) and with
//! `gemm` (`THREADS` threads through rayon), and prints the best time of
//! REPS runs of each in seconds, one line: "matrixmultiply <s> gemm <s>".
//! `benches/bench_gemm.py` runs it beside numpy's matmul and prints ratios.
use std::time::Instant;

fn best(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let a: Vec<usize> = std::env::args().skip(1).map(|s| s.parse().unwrap()).collect();
    let (m, n, k, reps, threads) = (a[0], a[1], a[2], a[3], a[4]);
    let x: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32) * 0.1).collect();
    let y: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 11) as f32) * 0.1).collect();
    let mut c = vec![0f32; m * n];
    let t_mm = best(reps, || unsafe {
        matrixmultiply::sgemm(
            m, k, n, 1.0, x.as_ptr(), k as isize, 1, y.as_ptr(), n as isize, 1, 0.0,
            c.as_mut_ptr(), n as isize, 1,
        )
    });
    let par = if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    let t_gemm = best(reps, || unsafe {
        gemm::gemm(
            m, n, k, c.as_mut_ptr(), 1, n as isize, false, x.as_ptr(), 1, k as isize,
            y.as_ptr(), 1, n as isize, 0.0f32, 1.0f32, false, false, false, par,
        )
    });
    println!("matrixmultiply {t_mm:.9} gemm {t_gemm:.9}");
}
