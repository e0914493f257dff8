//! The gRPC edge: `vserve.v1` service implementation, proto ↔ domain conversion, and the one mapping
//! from [`Error`] to `tonic::Status`. Every failed call is logged here, once.

use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::batch::{BatchSpec, DType, Layout};
use crate::engine::{ClipRequest, ClipsRequest, Engine, Positions, Resize, Transform};
use crate::error::Error;

/// Generated protobuf and gRPC server types.
pub mod pb {
    tonic::include_proto!("vserve.v1");
}

pub use pb::v_serve_server::VServeServer;

/// Bytes of array data per GetClips message: large enough to amortise per-message cost, small enough
/// for grpcio's default limits and to keep memory per in-flight message bounded.
pub const CHUNK_BYTES: usize = 8 << 20;

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        let msg = e.to_string();
        match e {
            Error::InvalidArgument(_) => Status::invalid_argument(msg),
            Error::NotFound(_) => Status::not_found(msg),
            Error::PermissionDenied(_) => Status::permission_denied(msg),
            Error::OutOfRange(_) => Status::out_of_range(msg),
            Error::Overloaded(_) => Status::resource_exhausted(msg),
            Error::ShuttingDown => Status::unavailable(msg),
            Error::DataLoss(_) | Error::Damaged(_) => Status::data_loss(msg),
            Error::Internal(_) => Status::internal(msg),
        }
    }
}

/// Converts and logs a failure of `method`.
fn fail(method: &'static str, e: Error) -> Status {
    let status = Status::from(e);
    match status.code() {
        tonic::Code::Internal => {
            tracing::error!(method, code = ?status.code(), message = status.message(), "request failed")
        }
        _ => {
            tracing::warn!(method, code = ?status.code(), message = status.message(), "request refused")
        }
    }
    status
}

pub struct Api {
    engine: Arc<Engine>,
}

impl Api {
    pub fn new(engine: Arc<Engine>) -> Self {
        Api { engine }
    }
}

fn transform_from_proto(t: Option<pb::Transform>) -> Result<Transform, Error> {
    let Some(t) = t else {
        return Ok(Transform::default());
    };
    let resize = match t.resize {
        None => Resize::Native,
        Some(pb::transform::Resize::Size(s)) => Resize::Exact {
            width: s.width,
            height: s.height,
        },
        Some(pb::transform::Resize::ShortSide(n)) => Resize::ShortSide(n),
    };
    let dtype = match pb::DType::try_from(t.dtype) {
        Ok(pb::DType::DtypeUint8) => DType::U8,
        Ok(pb::DType::DtypeFloat16) => DType::F16,
        Ok(pb::DType::DtypeFloat32) => DType::F32,
        Err(_) => return Err(Error::InvalidArgument(format!("unknown dtype {}", t.dtype))),
    };
    let layout = match pb::Layout::try_from(t.layout) {
        Ok(pb::Layout::Thwc) => Layout::Thwc,
        Ok(pb::Layout::Tchw) => Layout::Tchw,
        Err(_) => {
            return Err(Error::InvalidArgument(format!(
                "unknown layout {}",
                t.layout
            )))
        }
    };
    let per_channel = |name: &str, v: &[f32], default: f32| -> Result<[f32; 3], Error> {
        match v.len() {
            0 => Ok([default; 3]),
            1 => Ok([v[0]; 3]),
            3 => Ok([v[0], v[1], v[2]]),
            n => Err(Error::InvalidArgument(format!(
                "{name} has {n} values; give 1 or 3"
            ))),
        }
    };
    Ok(Transform {
        resize,
        rotate: !t.no_rotate,
        batch: BatchSpec {
            crop: t.center_crop.map(|c| (c.width, c.height)),
            hflip: t.hflip,
            dtype,
            mean: per_channel("mean", &t.mean, 0.0)?,
            std: per_channel("std", &t.std, 1.0)?,
            layout,
        },
    })
}

fn clips_from_proto(req: pb::GetClipsRequest) -> Result<ClipsRequest, Error> {
    let clips = req
        .clips
        .into_iter()
        .map(|c| {
            let positions = match c.positions {
                Some(pb::clip_spec::Positions::Frames(f)) => Positions::Frames(f.indices),
                Some(pb::clip_spec::Positions::Times(t)) => Positions::Times(t.seconds),
                None => {
                    return Err(Error::InvalidArgument(format!(
                        "clip of {:?} gives neither frames nor times",
                        c.video
                    )))
                }
            };
            Ok(ClipRequest {
                video: c.video,
                stream: c.stream,
                positions,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ClipsRequest {
        dataset: req.dataset,
        clips,
        transform: transform_from_proto(req.transform)?,
    })
}

type ClipStream = Pin<Box<dyn Stream<Item = Result<pb::GetClipsResponse, Status>> + Send>>;

#[tonic::async_trait]
impl pb::v_serve_server::VServe for Api {
    async fn probe(
        &self,
        request: Request<pb::ProbeRequest>,
    ) -> Result<Response<pb::ProbeResponse>, Status> {
        let req = request.into_inner();
        let index = self
            .engine
            .probe(&req.dataset, &req.video, req.stream)
            .await
            .map_err(|e| fail("Probe", e))?;
        let (dw, dh) = index.display_size();
        Ok(Response::new(pb::ProbeResponse {
            codec: index.codec.clone(),
            width: index.width,
            height: index.height,
            rotation: index.rotation as i32,
            avg_fps: index.avg_fps,
            time_base: Some(pb::Rational {
                num: index.time_base.0,
                den: index.time_base.1,
            }),
            duration_seconds: index.duration_seconds(),
            frame_count: index.frame_count() as u64,
            keyframes: index.keyframes.iter().map(|&k| k as u64).collect(),
            pts: if req.include_pts {
                index.frames.iter().map(|f| f.pts).collect()
            } else {
                Vec::new()
            },
            stream: index.stream as u32,
            pixel_format: index.pixel_format.clone(),
            declared_frames: index.declared_frames,
            display_width: dw,
            display_height: dh,
        }))
    }

    type GetClipsStream = ClipStream;

    async fn get_clips(
        &self,
        request: Request<pb::GetClipsRequest>,
    ) -> Result<Response<Self::GetClipsStream>, Status> {
        let req = clips_from_proto(request.into_inner()).map_err(|e| fail("GetClips", e))?;
        let dtype = req.transform.batch.dtype;
        let layout = req.transform.batch.layout;
        let reply = self
            .engine
            .get_clips(req)
            .await
            .map_err(|e| fail("GetClips", e))?;
        let header = pb::BatchHeader {
            shape: reply.shape,
            dtype: match dtype {
                DType::U8 => pb::DType::DtypeUint8,
                DType::F16 => pb::DType::DtypeFloat16,
                DType::F32 => pb::DType::DtypeFloat32,
            } as i32,
            layout: match layout {
                Layout::Thwc => pb::Layout::Thwc,
                Layout::Tchw => pb::Layout::Tchw,
            } as i32,
            clips: reply
                .clips
                .into_iter()
                .map(|c| pb::ClipInfo {
                    video: c.video,
                    frame_indices: c.frames,
                    pts: c.pts,
                    pts_seconds: c.pts_seconds,
                    ..Default::default()
                })
                .collect(),
            nbytes: reply.data.len() as u64,
            stats: Some(pb::RequestStats {
                frames_decoded: reply.stats.frames_decoded,
                cache_hits: reply.stats.cache_hits,
                cache_misses: reply.stats.cache_misses,
                gop_runs: reply.stats.gop_runs,
                shared_frames: reply.stats.shared_frames,
                frames_skipped: reply.stats.frames_skipped,
            }),
            ..Default::default()
        };
        let data = bytes::Bytes::from(reply.data);
        let mut messages = Vec::with_capacity(data.len() / CHUNK_BYTES + 1);
        let mut offset = 0;
        let mut header = Some(header);
        loop {
            let end = (offset + CHUNK_BYTES).min(data.len());
            messages.push(Ok(pb::GetClipsResponse {
                header: header.take(),
                offset: offset as u64,
                data: data.slice(offset..end),
            }));
            offset = end;
            if offset >= data.len() {
                break;
            }
        }
        Ok(Response::new(Box::pin(tokio_stream::iter(messages))))
    }

    type StreamBatchesStream =
        Pin<Box<dyn Stream<Item = Result<pb::StreamBatchesResponse, Status>> + Send>>;

    async fn stream_batches(
        &self,
        _request: Request<pb::StreamBatchesRequest>,
    ) -> Result<Response<Self::StreamBatchesStream>, Status> {
        Err(Status::unimplemented("StreamBatches is being built"))
    }

    async fn list_datasets(
        &self,
        _request: Request<pb::ListDatasetsRequest>,
    ) -> Result<Response<pb::ListDatasetsResponse>, Status> {
        let engine = self.engine.clone();
        let summaries = tokio::task::spawn_blocking(move || engine.datasets())
            .await
            .map_err(|e| fail("ListDatasets", Error::Internal(e.to_string())))?;
        Ok(Response::new(pb::ListDatasetsResponse {
            datasets: summaries
                .into_iter()
                .map(|d| pb::DatasetInfo {
                    name: d.name,
                    root: d.root,
                    video_count: d.video_count,
                })
                .collect(),
        }))
    }

    async fn get_stats(
        &self,
        _request: Request<pb::GetStatsRequest>,
    ) -> Result<Response<pb::GetStatsResponse>, Status> {
        let s = self.engine.stats();
        Ok(Response::new(pb::GetStatsResponse {
            frames_decoded: s.frames_decoded,
            gop_runs: s.gop_runs,
            cache_hits: s.cache_hits,
            cache_misses: s.cache_misses,
            cache_bytes: s.cache_bytes,
            cache_entries: s.cache_entries,
            index_builds: s.index_builds,
            requests: s.requests,
            decode_queue_depth: s.decode_queue_depth,
            shared_frames: s.shared_frames,
            frames_skipped: s.frames_skipped,
            ..Default::default()
        }))
    }
}
