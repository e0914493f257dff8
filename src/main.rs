//! `vserve`: parse flags, start logging, run the command, map errors to exit codes.
//!
//! Exit codes: 0 success; 1 a client command's request failed (the gRPC status name starts stderr);
//! 64 invalid flags or configuration (names the key and value); 69 hardware the configuration names is
//! missing (`--gpus` with no CUDA driver or no such GPU); 70 the server failed. `vserve check`: 1 when a
//! video is not ok, 69 when the daemon of `--daemon` could not run the check, 74 an unusable state
//! directory.

use clap::Parser;
use vserve::cli::{Cli, Command};

/// Writes to stderr like `eprintln!`, but a stderr that cannot be written (its reader gone, a full disk)
/// loses the line instead of panicking the thread that writes it.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// The log's stderr: a write that fails (the log's reader gone, its disk full) is dropped. tracing's own
/// fallback for a failed write is `eprintln!`, which panics: every thread that logged then panicked, so
/// requests were reset instead of answered, reloads failed, and the daemon exited 101 (probe G).
struct LogSink;

impl std::io::Write for LogSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::stderr().write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

/// Logs to stderr, filtered by `VSERVE_LOG` (default `info`), as text or one JSON object per line.
fn init_logging(format: vserve::config::LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("VSERVE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| LogSink);
    match format {
        vserve::config::LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        vserve::config::LogFormat::Json => builder.json().init(),
    }
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("vserve-rt")
        .build()
}

/// A command whose output is cut short (`vserve probe ... | head`) ends quietly, as a tool killed by
/// SIGPIPE does (status 141, what a shell reports for one), rather than with `println!`'s panic and
/// backtrace; one whose output cannot be written otherwise (a full disk, `> /dev/full`) says so and
/// exits 74 (EX_IOERR), as an unwritable `--out` does. SIGPIPE itself stays ignored: gRPC writes to a
/// closed socket must fail, not kill.
fn end_quietly_on_a_closed_stdout() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if let Some(why) = message.strip_prefix("failed printing to stdout") {
            if why.contains("Broken pipe") {
                std::process::exit(141);
            }
            say!(
                "vserve: cannot write stdout: {}",
                why.trim_start_matches(':').trim()
            );
            std::process::exit(74);
        }
        report(info)
    }));
}

/// An empty `VSERVE_*` variable counts as unset, as systemd's `Environment=VSERVE_X=` and a shell's
/// `VSERVE_X= vserve` mean it (each was refused as an invalid value of its flag, exit 64).
fn forget_empty_variables() {
    let empty: Vec<std::ffi::OsString> = std::env::vars_os()
        .filter(|(k, v)| v.is_empty() && k.to_str().is_some_and(|k| k.starts_with("VSERVE_")))
        .map(|(k, _)| k)
        .collect();
    for k in empty {
        // Before any other thread starts: nothing reads the environment concurrently.
        std::env::remove_var(k);
    }
}

fn main() -> std::process::ExitCode {
    // Held until the daemon watches them (a SIGHUP at start-up killed it); released at once for the
    // other commands.
    vserve::shutdown::hold(true);
    end_quietly_on_a_closed_stdout();
    forget_empty_variables();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version exit 0; a bad flag or env value is a usage error (EX_USAGE).
            let _ = e.print();
            return if e.use_stderr() {
                std::process::ExitCode::from(64)
            } else {
                std::process::ExitCode::SUCCESS
            };
        }
    };
    let command = cli.command.unwrap_or(Command::Serve(cli.serve));
    if !matches!(command, Command::Serve(_)) {
        vserve::shutdown::hold(false);
    }
    match command {
        Command::Serve(args) => {
            let config = match args.to_config() {
                Ok(c) => c,
                Err(e) => {
                    say!("vserve: {e}");
                    return std::process::ExitCode::from(64);
                }
            };
            init_logging(config.ops.log_format);
            if config.datasets.is_empty() {
                tracing::warn!("no --dataset given; serving nothing");
            }
            let caches = config.cache.bytes.saturating_add(config.cache.index_bytes);
            if let Some(memory) = vserve::config::host_memory_bytes().filter(|&m| caches > m) {
                tracing::warn!(
                    cache_bytes = config.cache.bytes,
                    index_cache_bytes = config.cache.index_bytes,
                    memory,
                    "the caches may grow past this host's (or its cgroup's) memory: the daemon would be killed for it first"
                );
            }
            tracing::info!(
                listen = ?config.listen.iter().map(|l| l.to_string()).collect::<Vec<_>>(),
                datasets = ?config.datasets.iter().map(|d| format!("{}={}", d.name, d.root.display())).collect::<Vec<_>>(),
                cache_bytes = config.cache.bytes,
                decode_threads = config.decode.threads,
                max_streams = config.limits.max_streams,
                admin = %config.ops.admin_listen.map_or_else(|| "none".to_owned(), |a| a.to_string()),
                log_format = config.ops.log_format.name(),
                auth_token = config.ops.auth_token_file.is_some(),
                tls = config.ops.tls.is_some(),
                "starting vserve {}",
                env!("CARGO_PKG_VERSION")
            );
            let rt = match runtime() {
                Ok(rt) => rt,
                Err(e) => {
                    say!("vserve: cannot start runtime: {e}");
                    return std::process::ExitCode::from(70);
                }
            };
            {
                let _in_runtime = rt.enter();
                vserve::shutdown::install();
            }
            vserve::shutdown::hold(false);
            let outcome = rt.block_on(vserve::server::run(config, vserve::shutdown::signal()));
            // Blocking threads stuck in a read (abandoned index builds) must not hold the exit: the grace
            // period is over by now.
            rt.shutdown_timeout(std::time::Duration::from_millis(100));
            match outcome {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(e @ vserve::server::ServerError::Unavailable(_)) => {
                    say!("vserve: {e}");
                    std::process::ExitCode::from(69)
                }
                Err(e) => {
                    say!("vserve: {e}");
                    std::process::ExitCode::from(70)
                }
            }
        }
        Command::Config(args) => match args.to_config() {
            Ok(c) => {
                print!("{}", vserve::cli::config_to_toml(&c));
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                say!("vserve: {e}");
                std::process::ExitCode::from(64)
            }
        },
        Command::Doctor(a) => vserve::commands::doctor::run(&a),
        Command::Ingest(a) => vserve::commands::ingest(&a),
        Command::GulpCheck(a) => vserve::commands::gulp_check(&a),
        Command::Check(a) => {
            init_logging(vserve::config::LogFormat::Text);
            vserve::commands::check::run(&a)
        }
        Command::Index(a) => {
            init_logging(vserve::config::LogFormat::Text);
            vserve::commands::index::run(&a)
        }
        client_command => {
            let rt = match runtime() {
                Ok(rt) => rt,
                Err(e) => {
                    say!("UNAVAILABLE: cannot start runtime: {e}");
                    return std::process::ExitCode::from(1);
                }
            };
            let result = rt.block_on(async {
                match &client_command {
                    Command::Probe(a) => vserve::commands::probe(a).await,
                    Command::Get(a) => vserve::commands::get(a).await,
                    Command::Stream(a) => vserve::commands::stream(a).await,
                    Command::Datasets(a) => vserve::commands::datasets(a).await,
                    Command::Stats(a) => vserve::commands::stats(a).await,
                    Command::Reload(a) => vserve::commands::reload(a).await,
                    Command::Quarantine(a) => vserve::commands::quarantine::run(a).await,
                    Command::Serve(_)
                    | Command::Config(_)
                    | Command::Doctor(_)
                    | Command::Ingest(_)
                    | Command::GulpCheck(_)
                    | Command::Check(_)
                    | Command::Index(_) => Ok(()),
                }
            });
            match result {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(e) => {
                    say!("{e}");
                    std::process::ExitCode::from(e.exit_code())
                }
            }
        }
    }
}
