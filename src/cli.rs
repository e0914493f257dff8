//! Command-line flags: the subcommands and their clap structs, nothing else. `vserve` with no subcommand
//! serves; the serve flags and their validation into a [`crate::config::Config`] live in
//! [`crate::config::load`] (every serve flag has a `VSERVE_*` environment twin and a key of the same name
//! in the `--config` TOML file: flag > env > file > default).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "vserve",
    version,
    about = "Per-host video decoding daemon serving frame-exact training batches over gRPC",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Serve datasets (the default command).
    Serve(ServeArgs),
    /// Print the effective configuration as TOML and exit.
    Config(ServeArgs),
    /// Print what this host decodes with: FFmpeg, decoders, hwaccels, CUDA driver, GPUs, --gpus choice.
    Doctor(DoctorArgs),
    /// Print a video's stream facts as JSON.
    Probe(ProbeArgs),
    /// Fetch frames of one video and write them as a uint8 [T,H,W,3] .npy file.
    Get(GetArgs),
    /// Read one rank's batches of an epoch: --list prints a JSON line per clip, --out-dir writes .npy files.
    Stream(StreamArgs),
    /// List the datasets a daemon serves, as JSON: counts and the sample list's fingerprint (with
    /// --labels, each label and its index).
    Datasets(DatasetsArgs),
    /// Print a daemon's counters as JSON.
    Stats(AddrArgs),
    /// Make a daemon walk its dataset roots again and re-read its manifests now (as SIGHUP does);
    /// prints the datasets after it as JSON; exit 1 when a dataset could not be reloaded.
    Reload(AddrArgs),
    /// List or clear the files in a daemon's crash quarantine (each crashed a daemon and is refused as
    /// DATA_LOSS until it changes).
    #[command(subcommand)]
    Quarantine(QuarantineCommand),
    /// Decode every video of a dataset once into a GulpIO dataset (chunked JPEG frames); resumable.
    Ingest(IngestArgs),
    /// Check a GulpIO directory (GulpIO's sanity checks plus JPEG validity); exit 1 on any problem.
    GulpCheck(GulpCheckArgs),
    /// Decode every video of a dataset whole, report each one's health, record it in the state directory;
    /// exit 1 when any video is not ok.
    Check(CheckArgs),
    /// Build the frame tables of a dataset (or one shard of it) into the state directory's store ahead of
    /// training, skipping files already stored unchanged; exit 1 when a video cannot be indexed.
    Index(IndexArgs),
}

/// `vserve index`: frame tables built into a state directory's store, without a daemon.
#[derive(Args, Debug, Clone)]
pub struct IndexArgs {
    /// NAME=DIR or NAME=DIR:manifest=FILE (as `vserve serve` takes it).
    #[arg(long, value_name = "NAME=DIR")]
    pub dataset: String,
    /// One JSON object per line (each video, then the summary) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Videos indexed at once (default: the cores).
    #[arg(long, value_name = "N")]
    pub jobs: Option<usize>,
    /// Only shard I of N (videos by a hash of their path, as `vserve check --shard`).
    #[arg(long, value_name = "I/N")]
    pub shard: Option<String>,
    /// State directory whose store receives the tables (as `vserve serve --state-dir`; required, since
    /// the tables are for the daemon that will use this directory).
    #[arg(long, env = "VSERVE_STATE_DIR", value_name = "DIR", required = true)]
    pub state_dir: Option<PathBuf>,
    /// Bound on the store's size (as `vserve serve --store-bytes`).
    #[arg(long, env = "VSERVE_STORE_BYTES", value_name = "SIZE")]
    pub store_bytes: Option<String>,
}

/// `vserve check`: a dataset's health, without a daemon (or inside one with --daemon).
#[derive(Args, Debug, Clone)]
pub struct CheckArgs {
    /// NAME=DIR or NAME=DIR:manifest=FILE (as `vserve serve` takes it); with --daemon, NAME of a dataset
    /// the daemon serves.
    #[arg(long, value_name = "NAME=DIR")]
    pub dataset: String,
    /// One JSON object per line (each video, then the summary) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Videos decoded at once (default: the cores; with --daemon, 1).
    #[arg(long, value_name = "N")]
    pub jobs: Option<usize>,
    /// Only shard I of N (videos by a hash of their path; the N shards together are the dataset).
    #[arg(long, value_name = "I/N")]
    pub shard: Option<String>,
    /// State directory whose store receives the results (as `vserve serve --state-dir`), or none.
    #[arg(long, env = "VSERVE_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Bound on the store's size (as `vserve serve --store-bytes`).
    #[arg(long, env = "VSERVE_STORE_BYTES", value_name = "SIZE")]
    pub store_bytes: Option<String>,
    /// Run the check inside the daemon at ADDR (unix:/path.sock or HOST:PORT); its store gets the results.
    #[arg(long, value_name = "ADDR")]
    pub daemon: Option<String>,
    /// With --daemon: file with the bearer token to send (default: the VSERVE_TOKEN environment variable).
    #[arg(long, value_name = "FILE", requires = "daemon")]
    pub token_file: Option<PathBuf>,
    /// With --daemon: CA certificate (PEM) to verify an https:// daemon with.
    #[arg(long, env = "VSERVE_TLS_CA", value_name = "FILE", requires = "daemon")]
    pub tls_ca: Option<PathBuf>,
}

/// `vserve doctor`: what this host decodes with.
#[derive(Args, Debug, Clone)]
pub struct DoctorArgs {
    /// Also say what this --gpus value would choose (auto is always shown).
    #[arg(long, value_name = "LIST")]
    pub gpus: Option<String>,
    /// One JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug, Clone)]
pub struct IngestArgs {
    /// Directory holding the videos (every video file under it, unless --manifest lists them).
    #[arg(long, value_name = "DIR")]
    pub dataset_dir: PathBuf,
    /// CSV or JSON Lines manifest (path, label, start, end), paths relative to --dataset-dir.
    #[arg(long, value_name = "FILE")]
    pub manifest: Option<PathBuf>,
    /// Output directory (created; an existing one is resumed).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Store frames at this rate (the frame displayed every 1/F s); default: every frame.
    #[arg(long, value_name = "F")]
    pub fps: Option<f64>,
    /// Resize so the short side has N pixels (bilinear, as GetClips' short side).
    #[arg(long, value_name = "N")]
    pub short_side: Option<u32>,
    /// JPEG quality (1-100).
    #[arg(long, default_value_t = 90, value_name = "Q")]
    pub quality: u8,
    /// Videos per chunk.
    #[arg(long, default_value_t = 100, value_name = "N")]
    pub videos_per_chunk: usize,
    /// Videos decoded in parallel (default: the cores).
    #[arg(long, value_name = "N")]
    pub jobs: Option<usize>,
    /// No progress line on stderr.
    #[arg(long)]
    pub quiet: bool,
}

#[derive(Args, Debug, Clone)]
pub struct GulpCheckArgs {
    /// The GulpIO directory.
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// Largest frame side in pixels, as `vserve serve --max-side`: a record whose JPEG header claims more
    /// than its square in pixels is reported, not decoded.
    #[arg(long, env = "VSERVE_MAX_SIDE", value_name = "PIXELS", default_value_t = crate::config::Limits::default().max_side,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_side: u32,
}

/// `vserve quarantine`: the crash quarantine of a running daemon (or, for `list`, of a state directory).
#[derive(Subcommand, Debug, Clone)]
pub enum QuarantineCommand {
    /// Print the quarantined files: one line each, or one JSON object with --json.
    List(QuarantineListArgs),
    /// Remove files from the daemon's quarantine (memory and state directory): they are served again.
    /// Needs the daemon's own user or root, on its Unix socket.
    Clear(QuarantineClearArgs),
}

#[derive(Args, Debug, Clone)]
pub struct QuarantineListArgs {
    #[command(flatten)]
    pub addr: AddrArgs,
    /// Read the quarantine persisted in this state directory instead of asking a daemon.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// One JSON object instead of lines.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug, Clone)]
pub struct QuarantineClearArgs {
    #[command(flatten)]
    pub addr: AddrArgs,
    /// A quarantined file's path, as `vserve quarantine list` prints it (repeatable).
    #[arg(long, value_name = "P", required_unless_present = "all")]
    pub path: Vec<String>,
    /// Clear every entry.
    #[arg(long, conflicts_with = "path")]
    pub all: bool,
    /// One JSON object instead of lines.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug, Clone)]
pub struct AddrArgs {
    /// Daemon address: unix:/path.sock or HOST:PORT.
    #[arg(long, env = "VSERVE_ADDR", default_value_t = vserve_client::default_addr())]
    pub addr: String,
    /// File with the bearer token to send (default: the VSERVE_TOKEN environment variable).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// CA certificate (PEM) to verify an https:// daemon with.
    #[arg(long, env = "VSERVE_TLS_CA", value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
pub struct DatasetsArgs {
    #[command(flatten)]
    pub addr: AddrArgs,
    /// Only this dataset.
    #[arg(long)]
    pub dataset: Option<String>,
    /// Each label with its index (`class_to_idx`).
    #[arg(long)]
    pub labels: bool,
}

#[derive(Args, Debug, Clone)]
pub struct ProbeArgs {
    #[command(flatten)]
    pub addr: AddrArgs,
    #[arg(long)]
    pub dataset: String,
    /// Video path relative to the dataset root.
    #[arg(long)]
    pub video: String,
    /// Container stream index (default: FFmpeg's best video stream).
    #[arg(long)]
    pub stream: Option<u32>,
    /// Include every frame's pts.
    #[arg(long)]
    pub pts: bool,
    /// Print the frame table as TorchCodec's `custom_frame_mappings` JSON instead:
    /// {"frames": [{"pts", "duration", "key_frame"}, ...]}, in the stream's time base.
    #[arg(long, conflicts_with = "pts")]
    pub frame_mappings: bool,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SamplerArg {
    RandomIndices,
    RegularIndices,
    RandomTimestamps,
    RegularTimestamps,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShortVideoArg {
    RepeatLast,
    Wrap,
    Skip,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemainderArg {
    Uneven,
    Pad,
    Drop,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnErrorArg {
    Skip,
    Fail,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DTypeArg {
    Uint8,
    Float16,
    Float32,
}

#[derive(Args, Debug, Clone)]
pub struct StreamArgs {
    #[command(flatten)]
    pub addr: AddrArgs,
    #[arg(long)]
    pub dataset: String,
    #[arg(long, value_enum, default_value = "random-indices")]
    pub sampler: SamplerArg,
    /// Clips per video (not for regular-timestamps).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub clips_per_video: u32,
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub frames_per_clip: u32,
    /// Index samplers: step between a clip's frames.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub frame_stride: u32,
    /// Timestamp samplers: seconds between a clip's frames (default 1 / average fps).
    #[arg(long, allow_negative_numbers = true)]
    pub seconds_between_frames: Option<f64>,
    /// Regular timestamps: seconds between clip starts.
    #[arg(long, allow_negative_numbers = true)]
    pub seconds_between_clip_starts: Option<f64>,
    /// Where clips may start: frame indices (index samplers) or seconds (timestamp samplers).
    #[arg(long, allow_hyphen_values = true)]
    pub range_start: Option<f64>,
    #[arg(long, allow_hyphen_values = true)]
    pub range_end: Option<f64>,
    /// Clips running past the video's end.
    #[arg(long, value_enum, default_value = "repeat-last")]
    pub short_video: ShortVideoArg,
    /// Exact output size WxH.
    #[arg(long, conflicts_with = "short_side")]
    pub size: Option<String>,
    /// Resize so the short side has N pixels, keeping the aspect ratio.
    #[arg(long)]
    pub short_side: Option<u32>,
    /// Keep the stored orientation (do not apply the display rotation).
    #[arg(long)]
    pub no_rotate: bool,
    /// Centre crop WxH.
    #[arg(long, conflicts_with_all = ["random_crop", "random_resized_crop"])]
    pub crop: Option<String>,
    /// Random crop WxH per clip.
    #[arg(long, conflicts_with = "random_resized_crop")]
    pub random_crop: Option<String>,
    /// torchvision-style RandomResizedCrop to WxH per clip (scale 0.08-1, ratio 3/4-4/3).
    #[arg(long)]
    pub random_resized_crop: Option<String>,
    /// Flip every clip horizontally.
    #[arg(long)]
    pub flip: bool,
    /// Flip each clip horizontally with probability 1/2.
    #[arg(long)]
    pub random_flip: bool,
    #[arg(long, value_enum, default_value = "uint8")]
    pub dtype: DTypeArg,
    #[arg(long)]
    pub batch_size: u32,
    #[arg(long)]
    pub drop_last: bool,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(long, default_value_t = 0)]
    pub epoch: u64,
    #[arg(long, default_value_t = 0)]
    pub rank: u32,
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub world_size: u32,
    /// Resume: the first batch to receive.
    #[arg(long, default_value_t = 0)]
    pub start_batch: u64,
    /// Batches the daemon prepares ahead.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    pub prefetch: u32,
    /// Keep the dataset's order instead of shuffling per epoch.
    #[arg(long)]
    pub no_shuffle: bool,
    /// How ranks split a remainder: uneven (disjoint, covers all), pad or drop (DistributedSampler).
    #[arg(long, value_enum, default_value = "uneven")]
    pub shard_remainder: RemainderArg,
    /// An unreadable sample: skip (replace and report) or fail (end with its error).
    #[arg(long, value_enum, default_value = "skip")]
    pub on_error: OnErrorArg,
    /// Stop after this many batches (then cancel the stream).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_batches: Option<u64>,
    /// Print one JSON line per clip, no pixels.
    #[arg(long, conflicts_with = "out_dir", required_unless_present = "out_dir")]
    pub list: bool,
    /// Write one .npy per batch (batch_NNNNNN.npy) into DIR.
    #[arg(long, value_name = "DIR")]
    pub out_dir: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
pub struct GetArgs {
    #[command(flatten)]
    pub addr: AddrArgs,
    #[arg(long)]
    pub dataset: String,
    #[arg(long)]
    pub video: String,
    /// Frame indices, comma-separated (a negative one is refused as not an index, not taken for a flag).
    #[arg(
        long,
        value_delimiter = ',',
        allow_hyphen_values = true,
        conflicts_with = "times",
        required_unless_present = "times"
    )]
    pub frames: Vec<u64>,
    /// Timestamps in seconds, comma-separated (`--times -0.5,1` is a value, not a flag: a list is no
    /// single number, so hyphen values are allowed, not only negative numbers).
    #[arg(long, value_delimiter = ',', allow_hyphen_values = true)]
    pub times: Vec<f64>,
    /// Exact output size WxH.
    #[arg(long, conflicts_with = "short_side")]
    pub size: Option<String>,
    /// Resize so the short side has N pixels, keeping the aspect ratio.
    #[arg(long)]
    pub short_side: Option<u32>,
    /// Keep the stored orientation (do not apply the display rotation).
    #[arg(long)]
    pub no_rotate: bool,
    #[arg(long)]
    pub stream: Option<u32>,
    /// Output .npy file.
    #[arg(long)]
    pub out: PathBuf,
}

/// The serve flags and the configuration they make live with the configuration.
pub use crate::config::load::{config_to_toml, ServeArgs};

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Command, clap::error::ErrorKind> {
        let mut all = vec!["vserve"];
        all.extend_from_slice(args);
        match Cli::try_parse_from(all) {
            Ok(c) => Ok(c.command.expect("a command")),
            Err(e) => Err(e.kind()),
        }
    }

    /// `--times -0.0` was refused as an unknown flag `-0` (only `--times=-0.0` passed); negative numbers
    /// are now values of the numeric options, and a negative frame index is refused as a bad value.
    #[test]
    fn negative_numbers_are_values_not_flags() {
        let get = ["get", "--dataset", "d", "--video", "v", "--out", "o.npy"];
        let times = |t: &[&str]| match parse(&[&get[..], t].concat()) {
            Ok(Command::Get(g)) => g.times.iter().map(|t| t.to_bits()).collect::<Vec<_>>(),
            other => panic!("{other:?}"),
        };
        assert_eq!(times(&["--times", "-0.0"]), [(-0.0f64).to_bits()]);
        assert_eq!(
            times(&["--times", "-1.5,2"]),
            [(-1.5f64).to_bits(), 2f64.to_bits()]
        );
        assert_eq!(
            parse(&[&get[..], &["--frames", "-1"]].concat()).unwrap_err(),
            clap::error::ErrorKind::ValueValidation
        );
        let stream = ["stream", "--dataset", "d", "--batch-size", "1", "--list"];
        match parse(
            &[
                &stream[..],
                &[
                    "--seconds-between-frames",
                    "-0.5",
                    "--seconds-between-clip-starts",
                    "-2",
                ],
            ]
            .concat(),
        ) {
            Ok(Command::Stream(s)) => assert_eq!(
                (s.seconds_between_frames, s.seconds_between_clip_starts),
                (Some(-0.5), Some(-2.0))
            ),
            other => panic!("{other:?}"),
        }
        // A list option takes what follows it, and says it is not a number.
        assert_eq!(
            parse(&[&get[..], &["--times", "--no-rotate"]].concat()).unwrap_err(),
            clap::error::ErrorKind::ValueValidation
        );
        // A single-number option takes a negative number, and a flag after it is a flag.
        assert_eq!(
            parse(&[&stream[..], &["--seconds-between-frames", "--flip"]].concat()).unwrap_err(),
            clap::error::ErrorKind::InvalidValue
        );
    }

    /// `vserve index` without `--state-dir` wrote into the default state directory, though the README
    /// gives the flag as required; it now is (VSERVE_STATE_DIR also sets it).
    #[test]
    fn index_needs_a_state_dir() {
        assert_eq!(
            parse(&["index", "--dataset", "d=/x"]).unwrap_err(),
            clap::error::ErrorKind::MissingRequiredArgument
        );
        match parse(&["index", "--dataset", "d=/x", "--state-dir", "/s"]) {
            Ok(Command::Index(a)) => assert_eq!(a.state_dir, Some(PathBuf::from("/s"))),
            other => panic!("{other:?}"),
        }
    }
}
