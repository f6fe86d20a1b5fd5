//! The promise judged by history, in CI: two replicas of the real controller for a minute of
//! seeded random holders, edits and faults, every `IPAMAllocation` and `IPAddress` version
//! recorded by watches and judged afterwards (`chaos.rs` says how). A failure prints the seed;
//! `KIPAM_HISTORY_SEED=<seed>` replays the same sequence of operations (the timing, and so
//! the interleaving with the controllers, differs from run to run), `KIPAM_HISTORY_SECONDS`
//! changes the length, `KIPAM_HISTORY_OPS=delete-cluster,create-cluster` narrows the kinds,
//! `KIPAM_HISTORY_LOG=1` prints every operation with its revision, `KIPAM_HISTORY_WRITE_MODEL=1`
//! makes every write cost what it costs on a real API server (the stand-in's `WriteModel`).

use super::chaos::{Config, OPS, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_two_holders_ever_show_one_address_while_holders_edits_and_faults_run() {
    let mut config = Config::from_env(60, 2);
    // The floor below, with room: operations go on until it is reached.
    config.min_versions = 150;
    let report = run("history", &config).await;
    eprintln!("{}", report.summary());
    assert!(
        report.failures.is_empty(),
        "{}\n\n{}",
        report.summary(),
        report.failures.join("\n\n")
    );
    // What it judged is what it claims to cover: every kind of operation and of fault.
    if config.only.is_none() {
        let missing: Vec<&&str> = OPS
            .iter()
            .filter(|o| !report.ops.contains_key(**o))
            .collect();
        assert!(
            missing.is_empty(),
            "never done: {missing:?}\n{}",
            report.summary()
        );
        for fault in ["kill-leader", "freeze-leader"] {
            assert!(
                report.faults.contains_key(fault),
                "no {fault}\n{}",
                report.summary()
            );
        }
    }
    assert!(report.versions > 100, "{}", report.summary());
}
