//! The promise judged by history, for as long as you like:
//! `cargo bench --bench soak -- [--seed N] [--seconds S] [--replicas R]` (defaults: a fresh
//! seed, 1800 s, 3 replicas; `KIPAM_HISTORY_SEED`, `KIPAM_HISTORY_SECONDS` and
//! `KIPAM_HISTORY_OPS` as for the test).
//!
//! The same run as `tests/controller/history.rs` (`tests/controller/chaos.rs` says what it
//! does and how it judges), with more replicas and the release build of `kipam controller`:
//! seeded random holders and edits, the leader killed, frozen past its lease and thawed, and
//! every `IPAMAllocation` and `IPAddress` version recorded by watches (resumed from the last
//! revision seen when the server ends them) and judged afterwards. Prints the operations,
//! the versions judged, the faults and the verdict; exits non-zero on any double holding or
//! when the seed does not settle.

#[allow(dead_code)]
#[path = "../tests/controller/support.rs"]
mod support;

#[allow(dead_code)]
#[path = "../tests/controller/metallb.rs"]
mod metallb;

#[allow(dead_code)]
#[path = "../tests/controller/chaos.rs"]
mod chaos;

use std::time::Duration;

fn main() {
    let mut config = chaos::Config::from_env(1800, 3);
    config.resume_watches = true;
    config.settle = Duration::from_secs(90);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| -> u64 {
            match args.next().map(|v| v.parse::<u64>()) {
                Some(Ok(v)) => v,
                _ => {
                    eprintln!("{name} takes a number");
                    std::process::exit(2);
                }
            }
        };
        match arg.as_str() {
            "--seed" => config.seed = value("--seed"),
            "--seconds" => config.duration = Duration::from_secs(value("--seconds")),
            "--replicas" => config.replicas = value("--replicas").max(1) as usize,
            // What `cargo bench` passes to every bench.
            "--bench" => {}
            other => {
                eprintln!("unknown argument {other:?}; use --seed N --seconds S --replicas R");
                std::process::exit(2);
            }
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let started = std::time::Instant::now();
    let report = runtime.block_on(chaos::run("soak", &config));
    println!("{}", report.summary());
    println!("wall time: {:?}", started.elapsed());
    if !report.failures.is_empty() {
        println!("\n{}", report.failures.join("\n\n"));
        std::process::exit(1);
    }
}
