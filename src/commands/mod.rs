//! Client subcommands for humans and scripts: `vserve probe`, `get`, `stream`, `datasets`, `stats`.
//!
//! Output goes to stdout as JSON (or to the .npy file for `get`). Failures return a [`CommandError`] for
//! `main` to print and exit with: the daemon's answer (text starting with the gRPC status name,
//! `NOT_FOUND: ...`, exit 1), or a local failure with its sysexits code (a bad flag value 64, an
//! unreadable input file 66, an output that cannot be written 74).

pub mod check;
pub mod doctor;
pub mod index;
pub mod ingest;
pub mod quarantine;

pub use ingest::{gulp_check, ingest};

use std::io::Write;
use std::path::Path;

use serde_json::json;
use vserve_client::{proto, Client, ClientError};

use crate::cli::{
    AddrArgs, DTypeArg, DatasetsArgs, GetArgs, OnErrorArg, ProbeArgs, RemainderArg, SamplerArg,
    ShortVideoArg, StreamArgs,
};
use crate::engine::for_each_stat;

/// Shared memory for a daemon on this host (a Unix socket), inline bytes otherwise.
fn local_transport(addr: &str) -> i32 {
    if addr.starts_with("unix:") {
        proto::Transport::Shm as i32
    } else {
        proto::Transport::Inline as i32
    }
}

/// Inline, after a shared-memory reply this process could not open (`why`, said on stderr): a daemon
/// in another container or of another user, whose Unix socket this one reaches.
fn inline_after(why: &str) -> i32 {
    eprintln!("warning: {why}; reading inline");
    proto::Transport::Inline as i32
}

/// How a client subcommand fails: the daemon (or the connection to it) refused, or something on this
/// side did, which no gRPC status describes.
#[derive(Debug)]
pub enum CommandError {
    /// The daemon's status or a connection failure: printed status name first, exit 1.
    Client(ClientError),
    /// A flag value that does not parse (EX_USAGE, 64).
    Usage(String),
    /// A file named by a flag that cannot be read (EX_NOINPUT, 66).
    NoInput(String),
    /// An output file or directory that cannot be written (EX_IOERR, 74).
    Output(String),
}

impl CommandError {
    /// The process exit status for this failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            CommandError::Client(_) => 1,
            CommandError::Usage(_) => 64,
            CommandError::NoInput(_) => 66,
            CommandError::Output(_) => 74,
        }
    }
}

impl std::fmt::Display for CommandError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CommandError::Client(e) => write!(f, "{e}"),
            CommandError::Usage(m) | CommandError::NoInput(m) | CommandError::Output(m) => {
                write!(f, "vserve: {m}")
            }
        }
    }
}

impl std::error::Error for CommandError {}

impl From<ClientError> for CommandError {
    fn from(e: ClientError) -> Self {
        CommandError::Client(e)
    }
}

/// Parses `WxH`.
fn parse_size(flag: &str, s: &str) -> Result<proto::Size, CommandError> {
    s.split_once(['x', 'X'])
        .and_then(|(w, h)| {
            Some(proto::Size {
                width: w.parse().ok()?,
                height: h.parse().ok()?,
            })
        })
        .ok_or_else(|| CommandError::Usage(format!("{flag} {s:?}: expected WxH")))
}

fn resize_of(
    size: &Option<String>,
    short_side: Option<u32>,
) -> Result<Option<proto::transform::Resize>, CommandError> {
    Ok(match (size, short_side) {
        (Some(s), _) => Some(proto::transform::Resize::Size(parse_size("--size", s)?)),
        (None, Some(n)) => Some(proto::transform::Resize::ShortSide(n)),
        (None, None) => None,
    })
}

/// Connects to `--addr` with the token from `--token-file` (else `VSERVE_TOKEN`) and the `--tls-ca`
/// certificate, when given.
pub async fn connect(args: &AddrArgs) -> Result<Client, CommandError> {
    let setup_err = |what: &str, path: &Path, e: std::io::Error| {
        CommandError::NoInput(format!("cannot read {what} {}: {e}", path.display()))
    };
    let token = match &args.token_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| setup_err("--token-file", path, e))?
                .trim()
                .to_owned(),
        ),
        None => std::env::var("VSERVE_TOKEN")
            .ok()
            .filter(|t| !t.trim().is_empty()),
    };
    let tls_ca_pem = match &args.tls_ca {
        Some(path) => Some(std::fs::read(path).map_err(|e| setup_err("--tls-ca", path, e))?),
        None => None,
    };
    Ok(Client::connect_with(
        &args.addr,
        &vserve_client::ConnectOptions { token, tls_ca_pem },
    )
    .await?)
}

pub async fn probe(args: &ProbeArgs) -> Result<(), CommandError> {
    let mut client = connect(&args.addr).await?;
    let r = client
        .probe(proto::ProbeRequest {
            dataset: args.dataset.clone(),
            video: args.video.clone(),
            include_pts: args.pts || args.frame_mappings,
            stream: args.stream,
        })
        .await?;
    if args.frame_mappings {
        println!("{}", frame_mappings(&r));
        return Ok(());
    }
    let tb = r.time_base.unwrap_or_default();
    let mut v = json!({
        "codec": r.codec,
        "stream": r.stream,
        "width": r.width,
        "height": r.height,
        "display_width": r.display_width,
        "display_height": r.display_height,
        "rotation": r.rotation,
        "mirrored": r.mirrored,
        "pixel_format": r.pixel_format,
        "avg_fps": r.avg_fps,
        "time_base": {"num": tb.num, "den": tb.den},
        "duration_seconds": r.duration_seconds,
        "frame_count": r.frame_count,
        "declared_frames": r.declared_frames,
        "keyframes": r.keyframes,
    });
    if args.pts {
        v["pts"] = json!(r.pts);
    }
    println!("{v}");
    Ok(())
}

/// A probe's frame table as TorchCodec's `custom_frame_mappings` JSON: `{"frames": [{"pts", "duration",
/// "key_frame"}]}` in presentation order, integers in the stream's time base (TorchCodec reads the first
/// frame's pts as the stream's start and the last one's pts + duration as its end). Durations are the
/// stream's stated ones (ffprobe's); where none is stated, the gap to the next frame (the average frame
/// duration for the last).
pub fn frame_mappings(r: &proto::ProbeResponse) -> serde_json::Value {
    let tb = r.time_base.unwrap_or_default();
    let avg = if r.avg_fps > 0.0 && tb.num > 0 {
        (tb.den as f64 / tb.num as f64 / r.avg_fps).round() as i64
    } else {
        0
    };
    let keys: std::collections::HashSet<u64> = r.keyframes.iter().copied().collect();
    let frames: Vec<serde_json::Value> = r
        .pts
        .iter()
        .enumerate()
        .map(|(k, &pts)| {
            let stated = r.durations.get(k).copied().unwrap_or(0);
            let gap = r.pts.get(k + 1).map_or(avg, |&next| next - pts);
            let duration = if stated > 0 { stated } else { gap.max(0) };
            json!({"pts": pts, "duration": duration, "key_frame": u8::from(keys.contains(&(k as u64)))})
        })
        .collect();
    json!({ "frames": frames })
}

pub async fn get(args: &GetArgs) -> Result<(), CommandError> {
    let resize = resize_of(&args.size, args.short_side)?;
    let mut clip = if args.times.is_empty() {
        vserve_client::clip_frames(&args.video, &args.frames)
    } else {
        vserve_client::clip_times(&args.video, &args.times)
    };
    clip.stream = args.stream;
    let mut client = connect(&args.addr).await?;
    let mut req = proto::GetClipsRequest {
        dataset: args.dataset.clone(),
        clips: vec![clip],
        transform: Some(proto::Transform {
            resize,
            no_rotate: args.no_rotate,
            ..Default::default()
        }),
        transport: local_transport(&args.addr.addr),
        reuse_arena: false,
        cache_policy: proto::CachePolicy::Auto as i32,
    };
    let batch = match client.get_clips(req.clone()).await {
        Err(ClientError::ShmUnreachable(why)) => {
            req.transport = inline_after(&why);
            client.get_clips(req).await?
        }
        got => got?,
    };
    // [1, T, H, W, 3] → [T, H, W, 3]
    let shape = &batch.header.shape[1..];
    write_npy(&args.out, shape, "|u1", &batch.data)
        .map_err(|e| CommandError::Output(format!("cannot write {}: {e}", args.out.display())))?;
    let info = batch.header.clips.first();
    println!(
        "{}",
        json!({
            "out": args.out.display().to_string(),
            "shape": shape,
            "frames": info.map(|c| c.frame_indices.clone()),
            "pts_seconds": info.map(|c| c.pts_seconds.clone()),
        })
    );
    Ok(())
}

/// The StreamBatches request the flags describe.
pub fn stream_request(args: &StreamArgs) -> Result<proto::StreamBatchesRequest, CommandError> {
    let kind = match args.sampler {
        SamplerArg::RandomIndices => proto::SamplerKind::SamplerRandomIndices,
        SamplerArg::RegularIndices => proto::SamplerKind::SamplerRegularIndices,
        SamplerArg::RandomTimestamps => proto::SamplerKind::SamplerRandomTimestamps,
        SamplerArg::RegularTimestamps => proto::SamplerKind::SamplerRegularTimestamps,
    };
    let short_video = match args.short_video {
        ShortVideoArg::RepeatLast => proto::ShortVideoPolicy::ShortVideoRepeatLast,
        ShortVideoArg::Wrap => proto::ShortVideoPolicy::ShortVideoWrap,
        ShortVideoArg::Skip => proto::ShortVideoPolicy::ShortVideoSkip,
    };
    let crop = match (&args.random_crop, &args.random_resized_crop) {
        (Some(c), _) => Some(proto::augment::Crop::RandomCrop(parse_size(
            "--random-crop",
            c,
        )?)),
        (None, Some(c)) => Some(proto::augment::Crop::RandomResizedCrop(
            proto::RandomResizedCrop {
                size: Some(parse_size("--random-resized-crop", c)?),
                ..Default::default()
            },
        )),
        (None, None) => None,
    };
    let center_crop = args
        .crop
        .as_deref()
        .map(|c| parse_size("--crop", c))
        .transpose()?;
    Ok(proto::StreamBatchesRequest {
        dataset: args.dataset.clone(),
        sampler: Some(proto::ClipSampler {
            kind: kind as i32,
            num_clips: args.clips_per_video,
            frames_per_clip: args.frames_per_clip,
            frame_stride: args.frame_stride,
            seconds_between_frames: args.seconds_between_frames.unwrap_or(0.0),
            seconds_between_clip_starts: args.seconds_between_clip_starts.unwrap_or(0.0),
            range_start: args.range_start,
            range_end: args.range_end,
            short_video: short_video as i32,
        }),
        transform: Some(proto::Transform {
            resize: resize_of(&args.size, args.short_side)?,
            center_crop,
            hflip: args.flip,
            dtype: match args.dtype {
                DTypeArg::Uint8 => proto::DType::DtypeUint8,
                DTypeArg::Float16 => proto::DType::DtypeFloat16,
                DTypeArg::Float32 => proto::DType::DtypeFloat32,
            } as i32,
            no_rotate: args.no_rotate,
            ..Default::default()
        }),
        augment: Some(proto::Augment {
            crop,
            random_hflip: args.random_flip,
        }),
        batch_size: args.batch_size,
        drop_last: args.drop_last,
        seed: args.seed,
        epoch: args.epoch,
        rank: args.rank,
        world_size: args.world_size,
        start_batch: args.start_batch,
        prefetch: args.prefetch,
        no_shuffle: args.no_shuffle,
        shard_remainder: match args.shard_remainder {
            RemainderArg::Uneven => proto::ShardRemainder::Uneven,
            RemainderArg::Pad => proto::ShardRemainder::Pad,
            RemainderArg::Drop => proto::ShardRemainder::Drop,
        } as i32,
        on_error: match args.on_error {
            OnErrorArg::Skip => proto::OnError::Skip,
            OnErrorArg::Fail => proto::OnError::Fail,
        } as i32,
        transport: local_transport(&args.addr.addr),
        worker: 0,
        num_workers: 0,
        start_sample: 0,
        cache_policy: proto::CachePolicy::Auto as i32,
        samples_fingerprint: None,
    })
}

pub async fn stream(args: &StreamArgs) -> Result<(), CommandError> {
    let req = stream_request(args)?;
    if let Some(dir) = &args.out_dir {
        std::fs::create_dir_all(dir)
            .map_err(|e| CommandError::Output(format!("cannot create {}: {e}", dir.display())))?;
    }
    let mut client = connect(&args.addr).await?;
    let mut batches = client.stream_batches(req.clone()).await?;
    let mut next = match batches.next().await {
        Err(ClientError::ShmUnreachable(why)) => {
            drop(batches); // cancels the stream: its arena goes with it
            let req = proto::StreamBatchesRequest {
                transport: inline_after(&why),
                ..req
            };
            batches = client.stream_batches(req).await?;
            batches.next().await?
        }
        got => got?,
    };
    let mut received = 0u64;
    let stdout = std::io::stdout();
    while let Some(batch) = next.take() {
        let h = &batch.header;
        for s in &h.skipped {
            eprintln!(
                "{}",
                json!({"batch": h.batch, "skipped": {"sample": s.sample, "video": s.video, "code": s.code, "message": s.message}})
            );
        }
        if args.list {
            let mut out = stdout.lock();
            for c in &h.clips {
                let line = json!({
                    "batch": h.batch,
                    "video": c.video,
                    "label": c.label,
                    "label_index": c.label_index,
                    "frames": c.frame_indices,
                    "sample": c.sample,
                    "clip": c.clip,
                    "replaced_by": c.replaced_by,
                    "crop": c.crop.as_ref().map(|r| [r.x, r.y, r.width, r.height]),
                    "flipped": c.flipped,
                });
                line_out(&mut out, &line.to_string());
            }
        }
        if let Some(dir) = &args.out_dir {
            let path = dir.join(format!("batch_{:06}.npy", h.batch));
            let descr = match h.dtype() {
                proto::DType::DtypeUint8 => "|u1",
                proto::DType::DtypeFloat16 => "<f2",
                proto::DType::DtypeFloat32 => "<f4",
            };
            write_npy(&path, &h.shape, descr, &batch.data).map_err(|e| {
                CommandError::Output(format!("cannot write {}: {e}", path.display()))
            })?;
            println!(
                "{}",
                json!({"batch": h.batch, "out": path.display().to_string(), "shape": h.shape})
            );
        }
        received += 1;
        if args.max_batches.is_some_and(|m| received >= m) {
            break;
        }
        next = batches.next().await?;
    }
    Ok(())
}

pub async fn datasets(args: &DatasetsArgs) -> Result<(), CommandError> {
    let mut client = connect(&args.addr).await?;
    // The labels are asked for only when printed: a million of them make an 18 MB reply.
    let r = client
        .list_datasets_with(proto::ListDatasetsRequest {
            dataset: args.dataset.clone().unwrap_or_default(),
            omit_labels: !args.labels,
        })
        .await?;
    let list: Vec<_> = r
        .datasets
        .iter()
        .map(|d| {
            let mut entry = json!({"name": d.name, "root": d.root, "video_count": d.video_count,
                   "samples": d.samples, "building": d.building,
                   "samples_fingerprint": d.samples_fingerprint});
            if args.labels {
                let labels: std::collections::BTreeMap<_, _> = d.class_to_idx.iter().collect();
                entry["class_to_idx"] = json!(labels);
            }
            entry
        })
        .collect();
    println!("{}", json!({ "datasets": list }));
    Ok(())
}

/// `vserve reload`: the Reload RPC; the datasets after it as JSON.
pub async fn reload(args: &AddrArgs) -> Result<(), CommandError> {
    let mut client = connect(args).await?;
    let r = client.reload().await?;
    let list: Vec<_> = r
        .datasets
        .iter()
        .map(|d| json!({"name": d.name, "video_count": d.video_count, "samples": d.samples}))
        .collect();
    println!(
        "{}",
        json!({"datasets": list, "changed": r.changed, "errors": r.errors})
    );
    if r.errors.is_empty() {
        Ok(())
    } else {
        Err(
            ClientError::Status(tonic::Status::failed_precondition(format!(
                "reload: {}",
                r.errors.join("; ")
            )))
            .into(),
        )
    }
}

pub async fn stats(args: &AddrArgs) -> Result<(), CommandError> {
    let mut client = connect(args).await?;
    let s = client.stats().await?;
    let mut out = serde_json::Map::new();
    macro_rules! fields {
        ($($field:ident)*) => {
            $(out.insert(stringify!($field).to_owned(), s.$field.into());)*
        };
    }
    for_each_stat!(fields);
    println!("{}", serde_json::Value::Object(out));
    Ok(())
}

/// Writes an array in NumPy's .npy format, version 1.0, C order; `descr` is NumPy's type string
/// (`|u1`, `<f2`, `<f4`).
pub fn write_npy(path: &Path, shape: &[u64], descr: &str, data: &[u8]) -> std::io::Result<()> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape_txt = if dims.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let mut header =
        format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_txt}, }}");
    // Magic (6) + version (2) + length (2) + header + '\n', padded to a multiple of 64.
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat((64 - unpadded % 64) % 64));
    header.push('\n');
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    f.write_all(b"\x93NUMPY\x01\x00")?;
    f.write_all(&(header.len() as u16).to_le_bytes())?;
    f.write_all(header.as_bytes())?;
    f.write_all(data)?;
    f.flush()
}

/// Writes one line of a command's output to stdout: a reader gone (`| head`) ends the command as
/// SIGPIPE would (141), any other failure (a full disk) says so and exits 74, as `println!` does through
/// the panic hook in `main.rs`. (A line output ignoring its errors went on streaming a whole epoch for a
/// reader that had exited, and exited 0.)
pub(crate) fn line_out(out: &mut impl Write, line: &str) {
    if let Err(e) = writeln!(out, "{line}").and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(141);
        }
        eprintln!("vserve: cannot write stdout: {e}");
        std::process::exit(74);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn npy_header_is_aligned_and_parsable() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.npy");
        super::write_npy(&p, &[2, 1, 1, 3], "|u1", &[1, 2, 3, 4, 5, 6]).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
        assert_eq!((10 + hlen) % 64, 0);
        let header = std::str::from_utf8(&bytes[10..10 + hlen]).unwrap();
        assert!(header.contains("'shape': (2, 1, 1, 3)"), "{header}");
        assert_eq!(&bytes[10 + hlen..], &[1, 2, 3, 4, 5, 6]);
    }
}
