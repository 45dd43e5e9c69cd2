//! `iwarp`: run, measure and operate the software iWARP dataplane.
//!
//! Every failure, a command-line mistake included, is one line on stderr
//! (`iwarp: …`) and a non-zero exit: 1 for a failed run, 2 for bad usage.

#![deny(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use iwarp::{control, demo, perf, rping, runner::TestKind, serve};

/// Software iWARP RNIC on DPDK: perftest-compatible perf tests, rping,
/// and a self-contained demo. With no subcommand, runs the demo.
#[derive(Debug, Parser)]
#[command(name = "iwarp", version)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Bring up two endpoints on virtual devices in this process and run
    /// WRITE, READ and SEND bandwidth and latency rounds with the data
    /// verified, next to same-run baselines: one core copying and
    /// CRC32c-summing the same bytes, the kernel's TCP over loopback, and
    /// one core handing each message to another (the default with no
    /// arguments; needs no NIC and no hugepages).
    Demo(demo::DemoArgs),
    /// A perftest-compatible test (`ib_write_bw -R` and friends): server
    /// without a peer address, client with one.
    Perf {
        /// Which test.
        #[arg(value_enum)]
        test: TestKind,
        // Boxed: perftest's options make it much larger than the others.
        #[command(flatten)]
        args: Box<perf::PerfArgs>,
    },
    /// rping-compatible ping-pong (Send, RDMA Read, RDMA Write), data
    /// verified.
    Rping(rping::RpingArgs),
    /// Run as a service: always-on perf and rping responders from the
    /// configuration file, a control socket and a Prometheus endpoint;
    /// stops cleanly on SIGTERM or SIGINT.
    Serve(serve::ServeArgs),
    /// A running service's counters, per worker and per port (through its
    /// control socket).
    Stats(control::StatsArgs),
    /// A running service's queue pairs.
    Qp {
        #[command(subcommand)]
        command: QpCommand,
    },
    /// Packet capture by a running service: every frame each worker
    /// receives and transmits, written off the data path into a pcap file
    /// that Wireshark decodes as iWARP (start it before the connections
    /// to look at: the MPA request tells Wireshark what follows). A
    /// relative FILE goes under the service's `serve.capture_dir`; frames
    /// the writer cannot keep up with are dropped and counted, never
    /// waited for.
    Capture {
        #[command(subcommand)]
        command: CaptureCommand,
    },
}

#[derive(Debug, Subcommand)]
enum CaptureCommand {
    /// Start capturing into FILE (one capture at a time).
    Start(control::CaptureStartArgs),
    /// Stop the capture: the frames captured and dropped, per worker.
    Stop(control::CaptureStopArgs),
}

#[derive(Debug, Subcommand)]
enum QpCommand {
    /// Each queue pair: peer, state, negotiated MPA options, bytes,
    /// retransmits, outstanding reads.
    List(control::QpListArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            // clap's message spans several lines (tips, usage): keep the
            // first, which says what was wrong.
            let text = e.to_string();
            let first = text
                .lines()
                .next()
                .unwrap_or("bad command line")
                .trim_start_matches("error: ");
            eprintln!("iwarp: {first} (see --help)");
            return ExitCode::from(2);
        }
    };
    let result = match cli
        .command
        .unwrap_or(Command::Demo(demo::DemoArgs::default()))
    {
        Command::Demo(a) => demo::run(&a),
        Command::Perf { test, args } => perf::run(test, &args),
        Command::Rping(a) => rping::run(&a),
        Command::Serve(a) => serve::run(&a),
        Command::Stats(a) => control::run_stats(&a),
        Command::Qp {
            command: QpCommand::List(a),
        } => control::run_qp_list(&a),
        Command::Capture {
            command: CaptureCommand::Start(a),
        } => control::run_capture_start(&a),
        Command::Capture {
            command: CaptureCommand::Stop(a),
        } => control::run_capture_stop(&a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("iwarp: {e}");
            ExitCode::FAILURE
        }
    }
}
