//! Reads batches from a running daemon: for every video of a dataset (given on the command line), probe
//! it, then fetch 8 uniformly spaced frames resized to short side 128, centre-cropped to 112x112,
//! normalised float32 in TCHW layout, as a trainer would; then the same request again (a cache hit).
//!
//! `cargo run -p vserve-client --example demo -- unix:/path.sock DATASET VIDEO...`

use std::time::Instant;

use vserve_client::{clip_frames, proto, Client};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        eprintln!("usage: demo ADDR DATASET VIDEO...");
        std::process::exit(2);
    }
    let (addr, dataset, videos) = (&args[0], &args[1], &args[2..]);
    let mut client = Client::connect(addr).await?;
    for d in client.list_datasets().await?.datasets {
        println!(
            "dataset {:?}: {} videos under {}",
            d.name, d.video_count, d.root
        );
    }
    let mut clips = Vec::new();
    for video in videos {
        let p = client
            .probe(proto::ProbeRequest {
                dataset: dataset.clone(),
                video: video.clone(),
                include_pts: false,
                stream: None,
            })
            .await?;
        println!(
            "{video}: {} {}x{} {:.2} fps, {} frames, {:.2} s, keyframes {:?}",
            p.codec,
            p.display_width,
            p.display_height,
            p.avg_fps,
            p.frame_count,
            p.duration_seconds,
            p.keyframes
        );
        let n = p.frame_count;
        let frames: Vec<u64> = (0..8).map(|i| (2 * i + 1) * n / 16).collect();
        clips.push(clip_frames(video, &frames));
    }
    let request = proto::GetClipsRequest {
        dataset: dataset.clone(),
        clips,
        transform: Some(proto::Transform {
            resize: Some(proto::transform::Resize::ShortSide(128)),
            center_crop: Some(proto::Size {
                width: 112,
                height: 112,
            }),
            dtype: proto::DType::DtypeFloat32 as i32,
            mean: vec![0.45, 0.45, 0.45],
            std: vec![0.225, 0.225, 0.225],
            layout: proto::Layout::Tchw as i32,
            ..Default::default()
        }),
        // A daemon on this host hands the array over in shared memory.
        transport: if addr.starts_with("unix:") {
            proto::Transport::Shm as i32
        } else {
            proto::Transport::Inline as i32
        },
        // Client::get_clips copies the reply out before releasing its slot, so it may be reused.
        reuse_arena: true,
        // The default: the frames enter the daemon's cache unless one video's are a scan. A client
        // reading frames once (a pass over a whole dataset) sends CachePolicy::OnePass instead.
        cache_policy: proto::CachePolicy::Auto as i32,
    };
    for pass in ["cold", "warm"] {
        let started = Instant::now();
        let batch = client.get_clips(request.clone()).await?;
        let secs = started.elapsed().as_secs_f64();
        let values: Vec<f32> = batch
            .data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let mean = values.iter().map(|&v| v as f64).sum::<f64>() / values.len() as f64;
        let stats = batch.header.stats.unwrap_or_default();
        println!(
            "{pass} batch: shape {:?} float32, mean {mean:.4}, {:.1} ms; decoded {} frames in {} GOP runs, {} cache hits",
            batch.shape(),
            secs * 1e3,
            stats.frames_decoded,
            stats.gop_runs,
            stats.cache_hits
        );
        for clip in &batch.header.clips {
            println!("  {}: frames {:?}", clip.video, clip.frame_indices);
        }
    }
    Ok(())
}
