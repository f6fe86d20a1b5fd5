//! The `kipam` command line.

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use kipam::address::{AddrRange, Cidr};
use kipam::allocator::{PoolAllocator, PoolConfig, PoolKind, Strategy};

#[derive(Parser)]
#[command(
    name = "kipam",
    version,
    about = "Multi-cluster IP address management for Kubernetes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Allocate from one pool for the named clusters, in order, and print the result.
    Allocate(AllocateArgs),
}

#[derive(clap::Args)]
struct AllocateArgs {
    /// The pool CIDR, IPv4 or IPv6 (`192.168.1.0/26`).
    #[arg(long = "pool-cidr")]
    pool_cidr: String,
    /// Range pool: addresses per cluster.
    #[arg(long, conflicts_with = "prefix", required_unless_present = "prefix")]
    range: Option<u128>,
    /// Prefix pool: subnet length per cluster.
    #[arg(long)]
    prefix: Option<u8>,
    #[arg(long, value_enum, default_value = "first-fit")]
    strategy: StrategyArg,
    /// An address, `first-last` range or CIDR kept out of allocations (repeatable).
    #[arg(long)]
    exclude: Vec<String>,
    /// Cluster names, served in the order given.
    #[arg(required = true)]
    clusters: Vec<String>,
}

#[derive(Clone, Copy, ValueEnum)]
enum StrategyArg {
    FirstFit,
    BestFit,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Allocate(args) => allocate(args),
    }
}

fn allocate(args: AllocateArgs) -> ExitCode {
    match run_allocate(&args) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

fn run_allocate(args: &AllocateArgs) -> Result<ExitCode, String> {
    let cidr: Cidr = args
        .pool_cidr
        .parse()
        .map_err(|e| format!("--pool-cidr: {e}"))?;
    let kind = match (args.range, args.prefix) {
        (Some(n), _) => PoolKind::Range {
            allocation_range: n,
        },
        (None, Some(len)) => PoolKind::Prefix {
            allocation_prefix: len,
        },
        (None, None) => return Err("one of --range or --prefix is required".into()),
    };
    let strategy = match args.strategy {
        StrategyArg::FirstFit => Strategy::FirstFit,
        StrategyArg::BestFit => Strategy::BestFit,
    };
    let mut pool =
        PoolAllocator::new(PoolConfig::new(cidr, kind, strategy)).map_err(|e| e.to_string())?;
    for text in &args.exclude {
        let range = AddrRange::parse_lenient(text).map_err(|e| format!("--exclude: {e}"))?;
        pool.exclude(range).map_err(|e| e.to_string())?;
    }
    let mut failed = false;
    println!("{:<24} {:<8} ALLOCATION", "CLUSTER", "STATUS");
    for cluster in &args.clusters {
        match pool.allocate(cluster, kind.default_request()) {
            Ok(allocation) => println!("{cluster:<24} {:<8} {allocation}", "ok"),
            Err(e) => {
                failed = true;
                println!("{cluster:<24} {:<8} {e}", "failed");
            }
        }
    }
    let usage = pool.usage();
    println!();
    println!(
        "pool {cidr}: total {}, allocated {}, excluded {}, available {}, \
         largest free block {}, fragmentation {}%",
        usage.total,
        usage.allocated,
        usage.excluded,
        usage.available,
        usage.largest_free_block,
        usage.fragmentation_percent
    );
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
