//! The `concord` server binary: etcd-compatible flags, logging, and the server loop.

/// mimalloc: cheaper than glibc malloc for many small, short-lived, cross-thread allocations.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use concord::config::{Config, Startup};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if std::env::args().nth(1).as_deref() == Some("snapshot") {
        use clap::Parser;
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                "info,fjall=warn,lsm_tree=warn",
            ))
            .with_writer(std::io::stderr)
            .init();
        return concord::snapshot::SnapshotCli::parse_from(std::env::args().skip(1)).run();
    }
    let (cfg, notes) = match Config::from_env_and_args() {
        Ok(Startup::Run(cfg, notes)) => (cfg, notes),
        Ok(Startup::Help) => {
            println!("{}", concord::config::help());
            return Ok(());
        }
        Ok(Startup::Version) => {
            println!("concord Version: {}", env!("CARGO_PKG_VERSION"));
            println!("etcd API Version: 3.5");
            return Ok(());
        }
        Err(e) => {
            eprintln!("{}", e.message);
            if e.usage {
                eprintln!("{}", concord::config::usage());
            }
            std::process::exit(e.code);
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!(
            "{},openraft=warn,lsm_tree=warn,fjall=warn",
            cfg.log_level
        ))
    });
    let writer = match log_writer(&cfg.log_outputs) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    if cfg.log_format == concord::config::LogFormat::Json {
        logs.json().init();
    } else {
        logs.init();
    }
    concord::config::log_notes(&notes);
    concord::server::run(*cfg).await
}

/// `--log-outputs`: `default` or `stderr`, `stdout`, or file paths (appended to), several
/// comma-separated as in etcd.
fn log_writer(outputs: &str) -> Result<tracing_subscriber::fmt::writer::BoxMakeWriter, String> {
    use tracing_subscriber::fmt::writer::{BoxMakeWriter, MakeWriterExt};
    let mut writer: Option<BoxMakeWriter> = None;
    for output in concord::config::split_urls(outputs) {
        let next = match output.as_str() {
            "default" | "stderr" => BoxMakeWriter::new(std::io::stderr),
            "stdout" => BoxMakeWriter::new(std::io::stdout),
            path => {
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|e| format!("--log-outputs {path}: {e}"))?;
                BoxMakeWriter::new(std::sync::Mutex::new(file))
            }
        };
        writer = Some(match writer {
            None => next,
            Some(w) => BoxMakeWriter::new(w.and(next)),
        });
    }
    Ok(writer.unwrap_or_else(|| BoxMakeWriter::new(std::io::stderr)))
}
