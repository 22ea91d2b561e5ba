//! The `fencecron` binary: parse the command line, run the command, map
//! errors to the documented exit codes.

use std::process::ExitCode;

use clap::Parser;
use fencecron::cli::Cli;
use fencecron::{commands, output};

fn main() -> ExitCode {
    // The run watchdog is this binary too; it must start with no runtime,
    // no log set-up and no argument parsing of its own.
    let mut args = std::env::args_os();
    if args.nth(1).is_some_and(|a| a == fencecron::shim::SHIM_ARG) {
        fencecron::shim::main(args.collect());
    }
    // What the completion scripts ask for (job names): no runtime, no log,
    // nothing on stderr; not a subcommand, so no help, page or completion
    // offers it.
    let mut args = std::env::args_os();
    if args.nth(1).is_some_and(|a| a == commands::COMPLETE_ARG) {
        return commands::complete(args.collect());
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // --help and --version print to stdout and exit 0, as clap does.
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            output::error_line(fencecron::cli::usage_error_sentence(
                &e,
                std::env::args_os(),
            ));
            return ExitCode::from(fencecron::error::EXIT_USAGE);
        }
    };
    // The daemon's large blocks mapped apart from its heaps, before its
    // first thread.
    if cli.is_daemon() {
        fencecron::config::keep_large_blocks_apart();
    }
    fencecron::logging::init(cli.log_format, cli.quiet());
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            output::error_line(format_args!("cannot start the async runtime: {e}"));
            return ExitCode::from(fencecron::error::EXIT_RUNTIME);
        }
    };
    match runtime.block_on(commands::dispatch(cli)) {
        Ok(exit) => ExitCode::from(exit.code()),
        Err(e) => {
            if !e.is_closed_pipe() {
                output::error_line(&e);
            }
            ExitCode::from(e.exit_code())
        }
    }
}
