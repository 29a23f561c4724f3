//! Probes the machine, not ferrocaffe: what one reading of each clock costs,
//! the floor of timing every op of a net (BENCHMARKS.md, "Timeline overhead
//! (issue 16)", W1's floor).
//!
//!     cargo bench --bench clock_cost
//!
//! Prints, per round, the time of back-to-back reads of the time-stamp
//! counter (`rdtsc`, the timeline's clock on x86_64), of `rdtscp`, and of
//! `Instant::now`; then a short serial chain of work per iteration, alone
//! and with an `rdtsc` stored per iteration (the counter read overlapping
//! work, as between two ops), and their difference.

use std::hint::black_box;
use std::time::Instant;

#[inline(never)]
fn work(x: &mut u64, n: u64) {
    for _ in 0..n {
        *x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
    }
}

#[cfg(target_arch = "x86_64")]
fn main() {
    use std::arch::x86_64::{__rdtscp, _rdtsc};
    let n = 20_000_000u64;
    let per = |t: Instant, n: u64| t.elapsed().as_nanos() as f64 / n as f64;
    for round in 1..=3 {
        let mut s = 0u64;
        let t = Instant::now();
        for _ in 0..n {
            // SAFETY: RDTSC exists on every x86_64 CPU.
            s = s.wrapping_add(unsafe { _rdtsc() });
        }
        let tsc = per(t, n);
        let mut aux = 0u32;
        let t = Instant::now();
        for _ in 0..n {
            // SAFETY: RDTSCP exists on the x86_64 CPUs this is run on.
            s = s.wrapping_add(unsafe { __rdtscp(&mut aux) });
        }
        let tscp = per(t, n);
        let t = Instant::now();
        for _ in 0..n / 10 {
            s = s.wrapping_add(black_box(Instant::now()).elapsed().as_nanos() as u64);
        }
        let instant = per(t, n / 10);
        let m = 2_000_000u64;
        let (mut x, mut buf) = (1u64, vec![0u64; 1024]);
        let t = Instant::now();
        for i in 0..m {
            work(&mut x, 10);
            buf[(i & 1023) as usize] = x;
        }
        let plain = per(t, m);
        let t = Instant::now();
        for i in 0..m {
            // SAFETY: as above.
            buf[(i & 1023) as usize] = unsafe { _rdtsc() };
            work(&mut x, 10);
        }
        let stamped = per(t, m);
        println!(
            "round {round}: rdtsc {tsc:.1} ns, rdtscp {tscp:.1} ns, Instant::now {instant:.1} ns; \
             work {plain:.1} ns/iter, with an rdtsc stored {stamped:.1} ns/iter (+{:.1}) [{}]",
            stamped - plain,
            black_box(s ^ x ^ buf[3]) & 1
        );
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    println!("clock_cost probes x86_64's time-stamp counter only");
}
