//! Client subcommands for humans and scripts: `vserve probe`, `get`, `datasets`, `stats`.
//!
//! Output goes to stdout as JSON (or to the .npy file for `get`). Failures return the client error, whose
//! text starts with the gRPC status name (`NOT_FOUND: ...`), for `main` to print and exit non-zero.

use std::io::Write;
use std::path::Path;

use serde_json::json;
use vserve_client::{proto, Client, ClientError};

use crate::cli::{AddrArgs, GetArgs, ProbeArgs};

/// Connects to `--addr` with the token from `--token-file` (else `VSERVE_TOKEN`) and the `--tls-ca`
/// certificate, when given.
pub async fn connect(args: &AddrArgs) -> Result<Client, ClientError> {
    let setup_err = |what: &str, path: &Path, e: std::io::Error| {
        ClientError::Status(tonic::Status::invalid_argument(format!(
            "cannot read {what} {}: {e}",
            path.display()
        )))
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
    Client::connect_with(
        &args.addr,
        &vserve_client::ConnectOptions { token, tls_ca_pem },
    )
    .await
}

pub async fn probe(args: &ProbeArgs) -> Result<(), ClientError> {
    let mut client = connect(&args.addr).await?;
    let r = client
        .probe(proto::ProbeRequest {
            dataset: args.dataset.clone(),
            video: args.video.clone(),
            include_pts: args.pts,
            stream: args.stream,
        })
        .await?;
    let tb = r.time_base.unwrap_or_default();
    let mut v = json!({
        "codec": r.codec,
        "stream": r.stream,
        "width": r.width,
        "height": r.height,
        "display_width": r.display_width,
        "display_height": r.display_height,
        "rotation": r.rotation,
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

pub async fn get(args: &GetArgs) -> Result<(), ClientError> {
    let resize = match (&args.size, args.short_side) {
        (Some(s), _) => {
            let (w, h) = s
                .split_once(['x', 'X'])
                .and_then(|(w, h)| Some((w.parse().ok()?, h.parse().ok()?)))
                .ok_or_else(|| {
                    ClientError::Status(tonic::Status::invalid_argument(format!(
                        "--size {s:?}: expected WxH"
                    )))
                })?;
            Some(proto::transform::Resize::Size(proto::Size {
                width: w,
                height: h,
            }))
        }
        (None, Some(n)) => Some(proto::transform::Resize::ShortSide(n)),
        (None, None) => None,
    };
    let mut clip = if args.times.is_empty() {
        vserve_client::clip_frames(&args.video, &args.frames)
    } else {
        vserve_client::clip_times(&args.video, &args.times)
    };
    clip.stream = args.stream;
    let mut client = connect(&args.addr).await?;
    let batch = client
        .get_clips(proto::GetClipsRequest {
            dataset: args.dataset.clone(),
            clips: vec![clip],
            transform: Some(proto::Transform {
                resize,
                no_rotate: args.no_rotate,
                ..Default::default()
            }),
        })
        .await?;
    // [1, T, H, W, 3] → [T, H, W, 3]
    let shape = &batch.header.shape[1..];
    write_npy(&args.out, shape, &batch.data).map_err(|e| {
        ClientError::Status(tonic::Status::internal(format!(
            "cannot write {}: {e}",
            args.out.display()
        )))
    })?;
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

pub async fn datasets(args: &AddrArgs) -> Result<(), ClientError> {
    let mut client = connect(args).await?;
    let r = client.list_datasets().await?;
    let list: Vec<_> = r
        .datasets
        .iter()
        .map(|d| json!({"name": d.name, "root": d.root, "video_count": d.video_count}))
        .collect();
    println!("{}", json!({ "datasets": list }));
    Ok(())
}

pub async fn stats(args: &AddrArgs) -> Result<(), ClientError> {
    let mut client = connect(args).await?;
    let s = client.stats().await?;
    println!(
        "{}",
        json!({
            "frames_decoded": s.frames_decoded,
            "gop_runs": s.gop_runs,
            "cache_hits": s.cache_hits,
            "cache_misses": s.cache_misses,
            "cache_bytes": s.cache_bytes,
            "cache_entries": s.cache_entries,
            "index_builds": s.index_builds,
            "requests": s.requests,
            "decode_queue_depth": s.decode_queue_depth,
            "shared_frames": s.shared_frames,
            "frames_skipped": s.frames_skipped,
        })
    );
    Ok(())
}

/// Writes a uint8 array in NumPy's .npy format, version 1.0, C order.
pub fn write_npy(path: &Path, shape: &[u64], data: &[u8]) -> std::io::Result<()> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape_txt = if dims.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let mut header = format!("{{'descr': '|u1', 'fortran_order': False, 'shape': {shape_txt}, }}");
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

#[cfg(test)]
mod tests {
    #[test]
    fn npy_header_is_aligned_and_parsable() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.npy");
        super::write_npy(&p, &[2, 1, 1, 3], &[1, 2, 3, 4, 5, 6]).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
        assert_eq!((10 + hlen) % 64, 0);
        let header = std::str::from_utf8(&bytes[10..10 + hlen]).unwrap();
        assert!(header.contains("'shape': (2, 1, 1, 3)"), "{header}");
        assert_eq!(&bytes[10 + hlen..], &[1, 2, 3, 4, 5, 6]);
    }
}
