//! Addon rendering benchmark: `cargo bench --bench render`.
//!
//! Renders the shipped `metallb` addon for 10,000 clusters on one thread — a third with a
//! range allocation (every fourth of them in two disjoint pieces), a third with a prefix
//! allocation, a third dual-stack (IPv4 range + IPv6 prefix) — and prints renders per second
//! and the time per render. A render is what the controller does per cluster: run the
//! templates, parse the YAML, check and label the objects. Writing the objects back out as
//! YAML (`kipam offline --out`, `kipam render`) is timed separately, and so are the same
//! renders through the render sandbox (the memory-bounded child process every kipam command
//! renders in), checked to give the same objects.
//!
//! Exits non-zero when rendering misses the target of issue #12: the 10,000 renders in under
//! 5 s (on the 2-core development machine; measured here on one thread, which is stricter).
//! Every render goes through the project's YAML library: there is no hand-written fast path.

use std::hint::black_box;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use kipam::render::sandbox::{DEFAULT_MAX_MEMORY, DEFAULT_TIMEOUT, SandboxOptions};
use kipam::render::{AllocationData, ClusterData, Renderer, TemplateData};

const CLUSTERS: usize = 10_000;
/// The 10,000 renders must take less than this.
const TARGET: Duration = Duration::from_secs(5);

fn main() -> ExitCode {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let renderer = match Renderer::load(&root.join("addons"), &root.join("templates")) {
        Ok(renderer) => renderer,
        Err(err) => {
            eprintln!("cannot load the addons: {err}");
            return ExitCode::FAILURE;
        }
    };
    let clusters: Vec<TemplateData> = (0..CLUSTERS).map(cluster).collect();

    println!("kipam render benchmark (one thread, release build)\n");

    // Warm-up: first-touch allocations and caches, not part of the figures.
    for data in clusters.iter().take(500) {
        if let Err(err) = renderer.render("metallb", data) {
            eprintln!("render failed: {err}");
            return ExitCode::FAILURE;
        }
    }

    let mut objects = 0usize;
    let mut rendered = Vec::with_capacity(CLUSTERS);
    let start = Instant::now();
    for data in &clusters {
        match renderer.render("metallb", black_box(data)) {
            Ok(addon) => {
                objects += addon.objects.len();
                rendered.push(addon);
            }
            Err(err) => {
                eprintln!("render failed: {err}");
                return ExitCode::FAILURE;
            }
        }
    }
    let render_time = start.elapsed();

    let start = Instant::now();
    let mut bytes = 0usize;
    for addon in &rendered {
        bytes += black_box(addon.to_yaml()).len();
    }
    let yaml_time = start.elapsed();

    let per_second = CLUSTERS as f64 / render_time.as_secs_f64();
    println!("metallb addon, {CLUSTERS} clusters (range, disjoint range, prefix, dual-stack):");
    println!(
        "  render:  {:>8.1} ms total, {:>6.2} µs per render, {:>9.0} renders/s ({objects} objects)",
        ms(render_time),
        us_per(render_time),
        per_second
    );
    println!(
        "  to_yaml: {:>8.1} ms total, {:>6.2} µs per addon,  {:>9.0} addons/s ({bytes} bytes)",
        ms(yaml_time),
        us_per(yaml_time),
        CLUSTERS as f64 / yaml_time.as_secs_f64()
    );

    // The same renders through the render sandbox (a memory-bounded child process), as every
    // kipam command renders: the cost of the process boundary per render.
    let sandboxed = match Renderer::load(&root.join("addons"), &root.join("templates")) {
        Ok(r) => r.with_sandbox(SandboxOptions {
            program: env!("CARGO_BIN_EXE_kipam").into(),
            max_memory: DEFAULT_MAX_MEMORY,
            timeout: DEFAULT_TIMEOUT,
        }),
        Err(err) => {
            eprintln!("cannot load the addons: {err}");
            return ExitCode::FAILURE;
        }
    };
    let start = Instant::now();
    for (data, direct) in clusters.iter().zip(&rendered) {
        match sandboxed.render("metallb", black_box(data)) {
            Ok(addon) if &addon == direct => {}
            Ok(_) => {
                eprintln!("the sandbox rendered something else than the engine in process");
                return ExitCode::FAILURE;
            }
            Err(err) => {
                eprintln!("sandboxed render failed: {err}");
                return ExitCode::FAILURE;
            }
        }
    }
    let sandbox_time = start.elapsed();
    println!(
        "  sandbox: {:>8.1} ms total, {:>6.2} µs per render, {:>9.0} renders/s (one child, \
         same objects; includes starting it)",
        ms(sandbox_time),
        us_per(sandbox_time),
        CLUSTERS as f64 / sandbox_time.as_secs_f64()
    );
    println!();
    if render_time < TARGET && sandbox_time < TARGET {
        println!(
            "ok: {CLUSTERS} renders in {:.2} s, under {} s",
            render_time.as_secs_f64(),
            TARGET.as_secs()
        );
        ExitCode::SUCCESS
    } else {
        println!(
            "MISSED: {CLUSTERS} renders took {:.2} s ({:.2} s sandboxed), not under {} s",
            render_time.as_secs_f64(),
            sandbox_time.as_secs_f64(),
            TARGET.as_secs()
        );
        ExitCode::FAILURE
    }
}

/// Cluster `i` of the mix.
fn cluster(i: usize) -> TemplateData {
    let dc = format!("dc-{}", i % 4);
    let base = ClusterData::new(format!("cluster-{i:05}"), dc.clone());
    // Eight addresses per cluster from 10.0.0.0/8, and a /30 or /120 per cluster elsewhere.
    let octets = |n: usize| format!("10.{}.{}.{}", (n >> 16) & 255, (n >> 8) & 255, n & 255);
    let first = i * 8;
    let range = format!("{}-{}", octets(first), octets(first + 7));
    let prefix = format!("172.16.{}.{}/30", (i * 4) >> 8 & 255, (i * 4) & 255);
    let prefix_v6 = format!("2001:db8:{:x}::/120", i);
    let cluster = match i % 3 {
        0 if i.is_multiple_of(4) => base.with_allocation(
            "metallb",
            AllocationData::range(
                &dc,
                [
                    format!("{}-{}", octets(first), octets(first + 3)),
                    format!("{}-{}", octets(first + 100_000), octets(first + 100_003)),
                ],
            ),
        ),
        0 => base.with_allocation("metallb", AllocationData::range(&dc, [range])),
        1 => base.with_allocation("metallb", AllocationData::prefix(&dc, prefix)),
        _ => base
            .with_allocation("metallb-ipv4", AllocationData::range(&dc, [range]))
            .with_allocation("metallb-ipv6", AllocationData::prefix(&dc, prefix_v6)),
    };
    TemplateData::new(cluster)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn us_per(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6 / CLUSTERS as f64
}
