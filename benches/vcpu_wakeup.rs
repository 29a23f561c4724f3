//! Probes the machine, not ferrocaffe: how long does a short burst of work on
//! two threads take when the second CPU has been idle?
//!
//!     cargo bench --bench vcpu_wakeup
//!
//! Two threads each do `burst` µs of busy work, after a 10 ms pause (as a
//! pipeline run does after the Python code that built it). Three hand-offs:
//! a freshly spawned thread, a parked thread woken through a channel, and a
//! thread that spins on a flag (its CPU never goes idle; the baseline). With
//! two CPUs truly free the first two take about `burst` µs, like the
//! baseline. On the 2-vCPU VM of BENCHMARKS.md they take nearly `2 × burst`
//! for bursts of a few ms: the second vCPU starts running the woken thread
//! only milliseconds later. This bounds any 2-thread speed-up of work that
//! short, whatever the code does (P1 in BENCHMARKS.md).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn busy(us: u64) -> u64 {
    let t = Instant::now();
    let mut x = 0u64;
    while t.elapsed() < Duration::from_micros(us) {
        for i in 0..100 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
    }
    x
}

fn median(mut v: Vec<u128>) -> u128 {
    v.sort_unstable();
    v[v.len() / 2]
}

fn main() {
    let rounds = 31;
    for burst in [1000u64, 3000, 30000] {
        let (mut spawned, mut woken, mut spinning) = (vec![], vec![], vec![]);
        let (tx, rx) = mpsc::channel::<u64>();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        std::thread::spawn(move || {
            for us in rx {
                std::hint::black_box(busy(us));
                if done_tx.send(()).is_err() {
                    return;
                }
            }
        });
        // 0: idle, u64::MAX: stop, else: work for that many µs.
        static FLAG: AtomicU64 = AtomicU64::new(0);
        // The previous burst's spinner was stopped with u64::MAX.
        FLAG.store(0, Ordering::Release);
        let spinner = std::thread::spawn(|| loop {
            match FLAG.load(Ordering::Acquire) {
                0 => std::hint::spin_loop(),
                u64::MAX => return,
                us => {
                    std::hint::black_box(busy(us));
                    FLAG.store(0, Ordering::Release);
                }
            }
        });
        for _ in 0..rounds {
            std::thread::sleep(Duration::from_millis(10));
            let t = Instant::now();
            std::thread::scope(|s| {
                s.spawn(|| std::hint::black_box(busy(burst)));
                std::hint::black_box(busy(burst));
            });
            spawned.push(t.elapsed().as_micros());

            std::thread::sleep(Duration::from_millis(10));
            let t = Instant::now();
            tx.send(burst).unwrap();
            std::hint::black_box(busy(burst));
            done_rx.recv().unwrap();
            woken.push(t.elapsed().as_micros());

            std::thread::sleep(Duration::from_millis(10));
            let t = Instant::now();
            FLAG.store(burst, Ordering::Release);
            std::hint::black_box(busy(burst));
            while FLAG.load(Ordering::Acquire) != 0 {
                std::hint::spin_loop();
            }
            spinning.push(t.elapsed().as_micros());
        }
        FLAG.store(u64::MAX, Ordering::Release);
        spinner.join().unwrap();
        let (a, b, c) = (median(spawned), median(woken), median(spinning));
        println!(
            "burst {burst:>5} µs on 2 threads: spawned {a} µs ({:.2}x the baseline), \
             woken {b} µs ({:.2}x), spinning peer (baseline) {c} µs; medians of {rounds}",
            a as f64 / c as f64,
            b as f64 / c as f64
        );
    }
}
