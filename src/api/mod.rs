//! The gRPC edge: `vserve.v1` service implementation, proto ↔ domain conversion, and the one mapping
//! from [`Error`] to `tonic::Status`. Every failed call is logged here, once.

use std::pin::Pin;
use std::sync::Arc;

use futures::StreamExt;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::batch::{DType, Layout};
use crate::engine::{for_each_stat, Engine};
use crate::error::{Code, Error};
use crate::handle;
use crate::handle::stream::StreamBatch;
use crate::peer::Peer;
use crate::transport::Transport;

/// Generated protobuf and gRPC server types.
pub mod pb {
    tonic::include_proto!("vserve.v1");
}

mod convert;
mod quarantine;
mod reply;

use convert::*;

pub use pb::v_serve_server::VServeServer;

/// Bytes of array data per GetClips message: large enough to amortise per-message cost, small enough
/// for grpcio's default limits and to keep memory per in-flight message bounded.
pub const CHUNK_BYTES: usize = 8 << 20;

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        let code = match e.code() {
            Code::InvalidArgument => tonic::Code::InvalidArgument,
            Code::NotFound => tonic::Code::NotFound,
            Code::PermissionDenied => tonic::Code::PermissionDenied,
            Code::OutOfRange => tonic::Code::OutOfRange,
            Code::ResourceExhausted => tonic::Code::ResourceExhausted,
            Code::Unavailable => tonic::Code::Unavailable,
            Code::DeadlineExceeded => tonic::Code::DeadlineExceeded,
            Code::DataLoss => tonic::Code::DataLoss,
            Code::FailedPrecondition => tonic::Code::FailedPrecondition,
            Code::Internal => tonic::Code::Internal,
        };
        Status::new(code, reply::bounded_message(e.to_string()))
    }
}

/// Converts and logs a failure of `method` from no known client.
fn fail(engine: &Engine, method: &'static str, e: Error) -> Status {
    fail_for(engine, method, None, e)
}

/// Converts and logs a failure of `method` for `peer`. Refusals for load (RESOURCE_EXHAUSTED) go through
/// the refusal log's rate limit per (client, limit), and errors the client caused (a bad argument, a
/// name that does not exist, a position out of range, no permission) through it per (client, code);
/// a file's failures (DATA_LOSS and the like) per (client, message); internal errors are logged each
/// time. The metrics count every one.
fn fail_for(engine: &Engine, method: &'static str, peer: Option<&Peer>, e: Error) -> Status {
    let client = || peer.map_or_else(|| "unknown".to_owned(), Peer::describe);
    if matches!(e, Error::ShuttingDown) {
        // Not refused: ended by the drain (a stream at its next batch), one line a call at INFO (it was
        // a WARN "request refused": probe C).
        tracing::info!(method, client = %client(), "call ended: the daemon is shutting down");
        return Status::from(e);
    }
    let status = Status::from(e);
    match status.code() {
        tonic::Code::Internal => {
            tracing::error!(method, code = ?status.code(), message = status.message(), "request failed")
        }
        tonic::Code::ResourceExhausted => {
            crate::refusal::RefusalLog::global().log(method, &client(), status.message());
        }
        code @ (tonic::Code::InvalidArgument
        | tonic::Code::NotFound
        | tonic::Code::OutOfRange
        | tonic::Code::PermissionDenied) => {
            crate::refusal::RefusalLog::global().log_client_error(
                method,
                &client(),
                vserve_client::code_name(code),
                status.message(),
            );
        }
        code => crate::refusal::RefusalLog::global().log_failure(
            method,
            &client(),
            vserve_client::code_name(code),
            status.message(),
        ),
    }
    // Logged with the whole paths; answered with the dataset-relative ones.
    match engine.catalog().client_message(status.message()) {
        Some(msg) => Status::new(status.code(), msg),
        None => status,
    }
}

pub struct Api {
    engine: Arc<Engine>,
}

impl Api {
    pub fn new(engine: Arc<Engine>) -> Self {
        Api { engine }
    }
}

/// One batch as messages: the header first, then the bytes in chunks.
fn stream_batch_messages(
    engine: &Engine,
    mut b: StreamBatch,
    dtype: DType,
    layout: Layout,
) -> Vec<Result<pb::StreamBatchesResponse, Status>> {
    // The client releases the slot from here on.
    if let Some(slot) = b.slot.take() {
        slot.handed();
    }
    let nbytes = b.shape.iter().product::<u64>() * dtype.size() as u64;
    let header = pb::BatchHeader {
        shape: b.shape,
        dtype: dtype_to_proto(dtype),
        layout: layout_to_proto(layout),
        clips: b
            .clips
            .into_iter()
            .map(|c| pb::ClipInfo {
                video: c.meta.video,
                frame_indices: c.meta.frames,
                pts: c.meta.pts,
                pts_seconds: c.meta.pts_seconds,
                duration_seconds: c.meta.duration_seconds,
                label: c.label.unwrap_or_default(),
                label_index: c.label_index,
                sample: c.sample,
                clip: c.clip,
                replaced_by: c.replaced_by,
                crop: c.crop.map(|r| pb::CropBox {
                    x: r.x,
                    y: r.y,
                    width: r.width,
                    height: r.height,
                }),
                flipped: c.flipped,
            })
            .collect(),
        nbytes,
        stats: Some(stats_to_proto(&b.stats)),
        shm: b.shm.as_ref().map(shm_to_proto),
        batch: b.batch,
        batches_total: b.batches_total.unwrap_or(0),
        samples_fingerprint: b.samples_fingerprint,
        skipped: b
            .skipped
            .into_iter()
            .map(|s| pb::SkippedSample {
                sample: s.sample,
                video: s.video,
                code: s.code,
                message: engine
                    .catalog()
                    .client_message(&s.message)
                    .unwrap_or(s.message),
            })
            .collect(),
    };
    chunks(b.data, header)
        .into_iter()
        .map(|(header, offset, data)| {
            Ok(pb::StreamBatchesResponse {
                header,
                offset,
                data,
            })
        })
        .collect()
}

/// Splits an array into (header on the first, offset, bytes) chunks of at most [`CHUNK_BYTES`].
fn chunks(
    data: Vec<u8>,
    header: pb::BatchHeader,
) -> Vec<(Option<pb::BatchHeader>, u64, bytes::Bytes)> {
    let data = bytes::Bytes::from(data);
    let mut out = Vec::with_capacity(data.len() / CHUNK_BYTES + 1);
    let mut offset = 0;
    let mut header = Some(header);
    loop {
        let end = (offset + CHUNK_BYTES).min(data.len());
        out.push((header.take(), offset as u64, data.slice(offset..end)));
        offset = end;
        if offset >= data.len() {
            break;
        }
    }
    out
}

/// The RPC layer's hold on budget until the reply's bytes are written (None for calls made in-process).
fn keep_of<T>(request: &Request<T>) -> Option<crate::budget::Keep> {
    request.extensions().get::<crate::budget::Keep>().cloned()
}

/// The client a call came from (set by the RPC layer from the connection; in-process calls have none).
fn peer_of<T>(request: &Request<T>) -> Peer {
    request
        .extensions()
        .get::<Peer>()
        .cloned()
        .unwrap_or_else(Peer::local)
}

/// `transport` for `peer`'s `method`, less shared memory it could not open ([`reachable_by`]): that
/// client is answered inline, with a warning a minute per client.
///
/// [`reachable_by`]: crate::transport::shm::ShmRegistry::reachable_by
fn transport_for(engine: &Engine, peer: &Peer, method: &'static str, t: Transport) -> Transport {
    if t != Transport::Shm || engine.shm().reachable_by(peer) {
        return t;
    }
    let client = peer.describe();
    let log = crate::refusal::RefusalLog::minutely();
    if let Some(suppressed) = log.note_at(&client, "shm-unreachable", std::time::Instant::now()) {
        tracing::warn!(
            method,
            client,
            suppressed,
            dir = %engine.shm().dir().display(),
            "the client asked for shared memory but is neither this daemon's user nor in its group, so it could not open the files: answering inline (run the client in the daemon's group, or the daemon as root)"
        );
    }
    Transport::Inline
}

type ClipStream = Pin<Box<dyn Stream<Item = Result<pb::GetClipsResponse, Status>> + Send>>;

#[tonic::async_trait]
impl pb::v_serve_server::VServe for Api {
    async fn probe(
        &self,
        request: Request<pb::ProbeRequest>,
    ) -> Result<Response<pb::ProbeResponse>, Status> {
        let peer = peer_of(&request);
        let keep = keep_of(&request);
        let req = request.into_inner();
        let probed = handle::probe::probe(
            &self.engine,
            &req.dataset,
            &req.video,
            req.stream,
            req.include_pts,
            &peer,
        )
        .await
        .map_err(|e| fail_for(&self.engine, "Probe", Some(&peer), e))?;
        let index = probed.index;
        let (dw, dh) = index.display_size();
        // The reply's bytes stay reserved until it is written.
        if let (Some(r), Some(keep)) = (probed.reservation, keep) {
            keep.hold(r);
        }
        Ok(Response::new(pb::ProbeResponse {
            codec: index.codec.clone(),
            width: index.width,
            height: index.height,
            rotation: index.rotation as i32,
            mirrored: index.mirror,
            avg_fps: index.avg_fps,
            time_base: Some(pb::Rational {
                num: index.time_base.0,
                den: index.time_base.1,
            }),
            duration_seconds: index.duration_seconds(),
            frame_count: index.frame_count() as u64,
            // Frames flagged key (as ffprobe's frame list says): the table's seek points also hold frame 0,
            // where decoding can always start, whatever its flag (an edit list starting on a B frame).
            keyframes: index
                .keyframes
                .iter()
                .filter(|&k| index.frames.at(k).key)
                .map(|k| k as u64)
                .collect(),
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
            durations: if req.include_pts {
                index.frames.iter().map(|f| f.stated_duration).collect()
            } else {
                Vec::new()
            },
            version: probed.version,
        }))
    }

    type GetClipsStream = ClipStream;

    async fn get_clips(
        &self,
        request: Request<pb::GetClipsRequest>,
    ) -> Result<Response<Self::GetClipsStream>, Status> {
        let peer = peer_of(&request);
        let keep = keep_of(&request);
        let raw = request.into_inner();
        let transport = transport_from_proto(raw.transport)
            .map_err(|e| fail_for(&self.engine, "GetClips", Some(&peer), e))?;
        let reuse = raw.reuse_arena;
        let mut req = clips_from_proto(raw)
            .map_err(|e| fail_for(&self.engine, "GetClips", Some(&peer), e))?;
        req.shm = transport_for(&self.engine, &peer, "GetClips", transport) == Transport::Shm;
        req.shm_reuse = req.shm && reuse;
        let dtype = req.transform.batch.dtype;
        let layout = req.transform.batch.layout;
        // In progress (GetStats' inflight_requests) until the reply's last byte is written.
        let inflight = self.engine.request_started();
        let reply = handle::clips::get_clips(&self.engine, req, &peer)
            .await
            .map_err(|e| fail_for(&self.engine, "GetClips", Some(&peer), e))?;
        let header = pb::BatchHeader {
            shape: reply.shape,
            dtype: dtype_to_proto(dtype),
            layout: layout_to_proto(layout),
            clips: reply
                .clips
                .into_iter()
                .map(|c| pb::ClipInfo {
                    video: c.video,
                    frame_indices: c.frames,
                    pts: c.pts,
                    pts_seconds: c.pts_seconds,
                    duration_seconds: c.duration_seconds,
                    ..Default::default()
                })
                .collect(),
            nbytes: reply.nbytes,
            shm: reply.shm.as_ref().map(shm_to_proto),
            stats: Some(stats_to_proto(&reply.stats)),
            ..Default::default()
        };
        let data = reply.data;
        // The reply's bytes stay reserved until its last message has been taken by the transport.
        let reservation = reply.reservation;
        // Bytes are counted by transport::deliver (shm) and on the wire (inline, rpc.rs).
        let messages: Vec<Result<pb::GetClipsResponse, Status>> = chunks(data, header)
            .into_iter()
            .map(|(header, offset, data)| {
                Ok(pb::GetClipsResponse {
                    header,
                    offset,
                    data,
                })
            })
            .collect();
        let idle = self.engine.stream_idle();
        Ok(Response::new(Box::pin(
            reply::Reply::new(messages, reservation, keep, idle, &peer).counted(inflight),
        )))
    }

    type StreamBatchesStream =
        Pin<Box<dyn Stream<Item = Result<pb::StreamBatchesResponse, Status>> + Send>>;

    async fn stream_batches(
        &self,
        request: Request<pb::StreamBatchesRequest>,
    ) -> Result<Response<Self::StreamBatchesStream>, Status> {
        let peer = peer_of(&request);
        let keep = keep_of(&request);
        let mut req = stream_from_proto(request.into_inner())
            .map_err(|e| fail_for(&self.engine, "StreamBatches", Some(&peer), e))?;
        req.transport = transport_for(&self.engine, &peer, "StreamBatches", req.transport);
        let (dtype, layout) = (req.transform.batch.dtype, req.transform.batch.layout);
        let rx = handle::stream::start_kept(&self.engine, req, peer.clone(), keep)
            .await
            .map_err(|e| fail_for(&self.engine, "StreamBatches", Some(&peer), e))?;
        let engine = self.engine.clone();
        let messages = tokio_stream::wrappers::ReceiverStream::new(rx).flat_map(move |item| {
            let out: Vec<Result<pb::StreamBatchesResponse, Status>> = match item {
                Err(e) => vec![Err(fail_for(&engine, "StreamBatches", Some(&peer), e))],
                Ok(b) => stream_batch_messages(&engine, b, dtype, layout),
            };
            tokio_stream::iter(out)
        });
        Ok(Response::new(Box::pin(messages)))
    }

    async fn release_slots(
        &self,
        request: Request<pb::ReleaseSlotsRequest>,
    ) -> Result<Response<pb::ReleaseSlotsResponse>, Status> {
        let peer = peer_of(&request);
        let req = request.into_inner();
        self.engine
            .shm()
            .release(&req.arena, &req.slots, &peer)
            .map_err(|e| fail_for(&self.engine, "ReleaseSlots", Some(&peer), Error::from(e)))?;
        Ok(Response::new(pb::ReleaseSlotsResponse {}))
    }

    async fn list_datasets(
        &self,
        request: Request<pb::ListDatasetsRequest>,
    ) -> Result<Response<pb::ListDatasetsResponse>, Status> {
        let req = request.into_inner();
        if !req.dataset.is_empty() {
            self.engine
                .catalog()
                .dataset(&req.dataset)
                .map_err(|e| fail(&self.engine, "ListDatasets", e))?;
        }
        // A manifest's labels are a string each: on a blocking thread, not a runtime worker's.
        let engine = self.engine.clone();
        let datasets = tokio::task::spawn_blocking(move || {
            let only = Some(req.dataset.as_str()).filter(|d| !d.is_empty());
            dataset_infos(engine.datasets(only, !req.omit_labels))
        })
        .await
        .map_err(|e| fail(&self.engine, "ListDatasets", Error::Internal(e.to_string())))?;
        Ok(Response::new(pb::ListDatasetsResponse { datasets }))
    }

    async fn reload(
        &self,
        _request: Request<pb::ReloadRequest>,
    ) -> Result<Response<pb::ReloadResponse>, Status> {
        let engine = self.engine.clone();
        let r = tokio::task::spawn_blocking(move || engine.catalog().reload())
            .await
            .map_err(|e| fail(&self.engine, "Reload", Error::Internal(e.to_string())))?;
        // A reload that found nothing new is not news (a client looping Reload wrote 28,000 lines in
        // 10 s, probe C); what changed or failed is.
        if r.changed.is_empty() && r.errors.is_empty() {
            tracing::debug!("Reload: datasets listed again, nothing changed");
        } else {
            tracing::info!(changed = ?r.changed, errors = r.errors.len(), "Reload: datasets listed again");
        }
        Ok(Response::new(pb::ReloadResponse {
            datasets: dataset_infos(self.engine.datasets(None, false)),
            changed: r.changed,
            errors: r.errors,
        }))
    }

    type CheckDatasetStream =
        Pin<Box<dyn Stream<Item = Result<pb::CheckDatasetResponse, Status>> + Send>>;

    async fn check_dataset(
        &self,
        request: Request<pb::CheckDatasetRequest>,
    ) -> Result<Response<Self::CheckDatasetStream>, Status> {
        let peer = peer_of(&request);
        let req = request.into_inner();
        let shard = match req.shard_count {
            0 if req.shard_index == 0 => crate::check::Shard::ALL,
            count if req.shard_index < count => crate::check::Shard {
                index: req.shard_index,
                count,
            },
            count => {
                return Err(fail_for(
                    &self.engine,
                    "CheckDataset",
                    Some(&peer),
                    Error::InvalidArgument(if count == 0 {
                        format!(
                            "shard_index {} needs a shard_count above it (0 with 0: the whole dataset)",
                            req.shard_index
                        )
                    } else {
                        format!(
                            "shard_index {} is not below shard_count {count}",
                            req.shard_index
                        )
                    }),
                ))
            }
        };
        let rx = handle::check::check_dataset(
            &self.engine,
            handle::check::CheckRequest {
                dataset: req.dataset,
                jobs: req.jobs as usize,
                shard,
                client: peer.key.clone(),
            },
        )
        .await
        .map_err(|e| fail_for(&self.engine, "CheckDataset", Some(&peer), e))?;
        let engine = self.engine.clone();
        let messages = tokio_stream::wrappers::ReceiverStream::new(rx).map(move |item| {
            let p = item.map_err(|e| fail_for(&engine, "CheckDataset", Some(&peer), e))?;
            let r = p.report;
            let reason = r.reason.unwrap_or_default();
            Ok(pb::CheckDatasetResponse {
                video: Some(pb::VideoHealth {
                    video: r.video,
                    status: r.status,
                    frames: r.frames,
                    decodable_frames: r.decodable_frames,
                    first_bad_frame: r.first_bad_frame,
                    reason: engine.catalog().client_message(&reason).unwrap_or(reason),
                    seconds: r.seconds,
                }),
                done: p.done,
                total: p.total,
            })
        });
        Ok(Response::new(Box::pin(messages)))
    }

    async fn quarantine(
        &self,
        request: Request<pb::QuarantineRequest>,
    ) -> Result<Response<pb::QuarantineResponse>, Status> {
        let peer = peer_of(&request);
        quarantine::answer(&self.engine, &peer, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn get_stats(
        &self,
        _request: Request<pb::GetStatsRequest>,
    ) -> Result<Response<pb::GetStatsResponse>, Status> {
        let s = self.engine.stats();
        macro_rules! reply {
            ($($field:ident)*) => {
                pb::GetStatsResponse { $($field: s.$field,)* }
            };
        }
        Ok(Response::new(for_each_stat!(reply)))
    }
}

/// ListDatasets' entries.
fn dataset_infos(summaries: Vec<crate::request::DatasetSummary>) -> Vec<pb::DatasetInfo> {
    summaries
        .into_iter()
        .map(|d| pb::DatasetInfo {
            name: d.name,
            root: d.root,
            video_count: d.video_count,
            samples: d.samples,
            class_to_idx: d.classes.into_iter().collect(),
            building: d.building,
            samples_fingerprint: d.samples_fingerprint,
        })
        .collect()
}
