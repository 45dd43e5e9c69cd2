//! `iwarp`: run, measure and operate the software iWARP dataplane.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use dataplane::tool::{demo, perf, rping, runner::TestKind};

/// Software iWARP RNIC on DPDK: perftest-compatible perf tests, rping,
/// and a self-contained demo. With no subcommand, runs the demo.
#[derive(Debug, Parser)]
#[command(name = "iwarp", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Bring up two endpoints on virtual devices in this process and run
    /// WRITE, READ and SEND bandwidth and latency rounds with the data
    /// verified (the default with no arguments; needs no NIC and no
    /// hugepages).
    Demo(demo::DemoArgs),
    /// A perftest-compatible test (`ib_write_bw -R` and friends): server
    /// without a peer address, client with one.
    Perf {
        /// Which test.
        #[arg(value_enum)]
        test: TestKind,
        #[command(flatten)]
        args: perf::PerfArgs,
    },
    /// rping-compatible ping-pong (Send, RDMA Read, RDMA Write), data
    /// verified.
    Rping(rping::RpingArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command.unwrap_or(Command::Demo(demo::DemoArgs::default())) {
        Command::Demo(a) => demo::run(&a),
        Command::Perf { test, args } => perf::run(test, &args),
        Command::Rping(a) => rping::run(&a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("iwarp: {e}");
            ExitCode::FAILURE
        }
    }
}
