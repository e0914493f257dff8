//! A plain GetClips reply assembled in place: its shared-memory arena is taken before decoding, each
//! video's runs that bypass the cache convert wanted frames straight into it ([`crate::decode::sink`]),
//! and assembly fills only what the decoders did not write (frames from the cache or from other
//! requests' runs, frames listed twice) before the reply is published.

use std::collections::HashMap;
use std::sync::Arc;

use crate::batch;
use crate::decode::sink::Sink;
use crate::decode::Frame;
use crate::engine::Engine;
use crate::error::Error;
use crate::metrics::Timer;
use crate::peer::Peer;
use crate::request::ClipsRequest;
use crate::transport::publish_reply;
use crate::transport::shm::{PendingReply, ShmRef};

/// Whether the batch is the frames themselves, one after another (uint8 THWC, no crop, no flip): what
/// a decoder can write in place.
pub(super) fn plain(spec: &batch::BatchSpec) -> bool {
    spec.dtype == batch::DType::U8
        && spec.layout == batch::Layout::Thwc
        && spec.crop.is_none()
        && !spec.hflip
}

/// A plain reply assembled in place: its shared-memory arena, taken before decoding, and per video a
/// sink giving each wanted frame the place of its first position in the array.
pub(super) struct InPlace {
    reply: Arc<PendingReply>,
    reusable: bool,
    frame_bytes: usize,
    /// Per video, per frame: the offset of its first position.
    first: Vec<HashMap<usize, usize>>,
    pub(super) sinks: Vec<Arc<Sink>>,
}

impl InPlace {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn reserve(
        engine: &Arc<Engine>,
        req: &ClipsRequest,
        peer: &Peer,
        nbytes: usize,
        (w, h): (u32, u32),
        clip_frames: &[Vec<usize>],
        clip_video: &[usize],
        videos: usize,
    ) -> Result<InPlace, Error> {
        let frame_bytes = w as usize * h as usize * 3;
        let reply = Arc::new(engine.shm().reserve_reply(nbytes, req.shm_reuse, peer)?);
        let mut first: Vec<HashMap<usize, usize>> = vec![HashMap::new(); videos];
        let mut at = 0;
        for (frames, &vi) in clip_frames.iter().zip(clip_video) {
            for &k in frames {
                first[vi].entry(k).or_insert(at);
                at += frame_bytes;
            }
        }
        if at != nbytes {
            return Err(Error::Internal(format!(
                "a plain batch of {nbytes} bytes holds {at} bytes of frames"
            )));
        }
        let sinks = first
            .iter()
            .map(|places| {
                reply
                    .sink(frame_bytes, places.iter().map(|(&k, &o)| (k, o)))
                    .map(Arc::new)
                    .map_err(Error::Internal)
            })
            .collect::<Result<_, _>>()?;
        Ok(InPlace {
            reply,
            reusable: req.shm_reuse,
            frame_bytes,
            first,
            sinks,
        })
    }

    /// Fills every position the decoders did not (frames from the cache or other requests' runs, and
    /// frames listed twice), publishes the reply and gives frames nobody else holds back to the pool.
    /// Called once every fetch given a sink has returned.
    pub(super) fn finish(
        self,
        engine: &Engine,
        clip_frames: &[Vec<usize>],
        clip_video: &[usize],
        per_video: Vec<HashMap<usize, Arc<Frame>>>,
    ) -> Result<ShmRef, Error> {
        let fb = self.frame_bytes;
        let timer = Timer::start();
        // SAFETY: every fetch given one of this reply's sinks has returned, so every run that wrote into
        // it has; the sinks still held by finished jobs write nothing more.
        unsafe {
            self.reply.with_bytes(|buf| -> Result<(), Error> {
                let mut at = 0;
                for (frames, &vi) in clip_frames.iter().zip(clip_video) {
                    for &k in frames {
                        match per_video[vi].get(&k) {
                            Some(f) if f.data.len() == fb => {
                                buf[at..at + fb].copy_from_slice(&f.data)
                            }
                            Some(f) => {
                                return Err(Error::Internal(format!(
                                    "frame {k} is {}x{}, not the batch's size",
                                    f.width, f.height
                                )))
                            }
                            // Written in place at its first position.
                            None => match self.first[vi].get(&k) {
                                Some(&from) if from != at => buf.copy_within(from..from + fb, at),
                                Some(_) => {}
                                None => {
                                    return Err(Error::Internal(format!(
                                        "frame {k} missing after decode"
                                    )))
                                }
                            },
                        }
                        at += fb;
                    }
                }
                Ok(())
            })?;
        }
        timer.observe(&engine.metrics().batch_assembly);
        drop(per_video); // frames only this reply held: their buffers go back to the pool
        let delivered = publish_reply(engine.shm(), &self.reply, self.reusable, engine.metrics())?;
        match delivered.into_parts() {
            (_, Some(shm)) => Ok(shm),
            (_, None) => Err(Error::Internal("a published reply has no slot".into())),
        }
    }
}
