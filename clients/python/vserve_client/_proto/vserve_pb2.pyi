from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UINT8: _ClassVar[DType]
    DTYPE_FLOAT16: _ClassVar[DType]
    DTYPE_FLOAT32: _ClassVar[DType]

class Layout(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LAYOUT_THWC: _ClassVar[Layout]
    LAYOUT_TCHW: _ClassVar[Layout]

class Transport(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRANSPORT_INLINE: _ClassVar[Transport]
    TRANSPORT_SHM: _ClassVar[Transport]

class CachePolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CACHE_POLICY_AUTO: _ClassVar[CachePolicy]
    CACHE_POLICY_ONE_PASS: _ClassVar[CachePolicy]
    CACHE_POLICY_KEEP: _ClassVar[CachePolicy]

class SamplerKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SAMPLER_RANDOM_INDICES: _ClassVar[SamplerKind]
    SAMPLER_REGULAR_INDICES: _ClassVar[SamplerKind]
    SAMPLER_RANDOM_TIMESTAMPS: _ClassVar[SamplerKind]
    SAMPLER_REGULAR_TIMESTAMPS: _ClassVar[SamplerKind]

class ShortVideoPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SHORT_VIDEO_REPEAT_LAST: _ClassVar[ShortVideoPolicy]
    SHORT_VIDEO_WRAP: _ClassVar[ShortVideoPolicy]
    SHORT_VIDEO_SKIP: _ClassVar[ShortVideoPolicy]

class ShardRemainder(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SHARD_REMAINDER_UNEVEN: _ClassVar[ShardRemainder]
    SHARD_REMAINDER_PAD: _ClassVar[ShardRemainder]
    SHARD_REMAINDER_DROP: _ClassVar[ShardRemainder]

class OnError(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ON_ERROR_SKIP: _ClassVar[OnError]
    ON_ERROR_FAIL: _ClassVar[OnError]
DTYPE_UINT8: DType
DTYPE_FLOAT16: DType
DTYPE_FLOAT32: DType
LAYOUT_THWC: Layout
LAYOUT_TCHW: Layout
TRANSPORT_INLINE: Transport
TRANSPORT_SHM: Transport
CACHE_POLICY_AUTO: CachePolicy
CACHE_POLICY_ONE_PASS: CachePolicy
CACHE_POLICY_KEEP: CachePolicy
SAMPLER_RANDOM_INDICES: SamplerKind
SAMPLER_REGULAR_INDICES: SamplerKind
SAMPLER_RANDOM_TIMESTAMPS: SamplerKind
SAMPLER_REGULAR_TIMESTAMPS: SamplerKind
SHORT_VIDEO_REPEAT_LAST: ShortVideoPolicy
SHORT_VIDEO_WRAP: ShortVideoPolicy
SHORT_VIDEO_SKIP: ShortVideoPolicy
SHARD_REMAINDER_UNEVEN: ShardRemainder
SHARD_REMAINDER_PAD: ShardRemainder
SHARD_REMAINDER_DROP: ShardRemainder
ON_ERROR_SKIP: OnError
ON_ERROR_FAIL: OnError

class QuarantineRequest(_message.Message):
    __slots__ = ("clear", "all")
    CLEAR_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    clear: _containers.RepeatedScalarFieldContainer[str]
    all: bool
    def __init__(self, clear: _Optional[_Iterable[str]] = ..., all: _Optional[bool] = ...) -> None: ...

class QuarantinedFile(_message.Message):
    __slots__ = ("path", "size", "mtime_ns", "since", "reason")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MTIME_NS_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    path: str
    size: int
    mtime_ns: int
    since: int
    reason: str
    def __init__(self, path: _Optional[str] = ..., size: _Optional[int] = ..., mtime_ns: _Optional[int] = ..., since: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class QuarantineResponse(_message.Message):
    __slots__ = ("files", "cleared", "location")
    FILES_FIELD_NUMBER: _ClassVar[int]
    CLEARED_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    files: _containers.RepeatedCompositeFieldContainer[QuarantinedFile]
    cleared: _containers.RepeatedCompositeFieldContainer[QuarantinedFile]
    location: str
    def __init__(self, files: _Optional[_Iterable[_Union[QuarantinedFile, _Mapping]]] = ..., cleared: _Optional[_Iterable[_Union[QuarantinedFile, _Mapping]]] = ..., location: _Optional[str] = ...) -> None: ...

class Rational(_message.Message):
    __slots__ = ("num", "den")
    NUM_FIELD_NUMBER: _ClassVar[int]
    DEN_FIELD_NUMBER: _ClassVar[int]
    num: int
    den: int
    def __init__(self, num: _Optional[int] = ..., den: _Optional[int] = ...) -> None: ...

class ProbeRequest(_message.Message):
    __slots__ = ("dataset", "video", "include_pts", "stream")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    VIDEO_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_PTS_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    video: str
    include_pts: bool
    stream: int
    def __init__(self, dataset: _Optional[str] = ..., video: _Optional[str] = ..., include_pts: _Optional[bool] = ..., stream: _Optional[int] = ...) -> None: ...

class ProbeResponse(_message.Message):
    __slots__ = ("codec", "width", "height", "rotation", "avg_fps", "time_base", "duration_seconds", "frame_count", "keyframes", "pts", "stream", "pixel_format", "declared_frames", "display_width", "display_height", "durations", "mirrored", "version")
    CODEC_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    ROTATION_FIELD_NUMBER: _ClassVar[int]
    AVG_FPS_FIELD_NUMBER: _ClassVar[int]
    TIME_BASE_FIELD_NUMBER: _ClassVar[int]
    DURATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FRAME_COUNT_FIELD_NUMBER: _ClassVar[int]
    KEYFRAMES_FIELD_NUMBER: _ClassVar[int]
    PTS_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    PIXEL_FORMAT_FIELD_NUMBER: _ClassVar[int]
    DECLARED_FRAMES_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_WIDTH_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    DURATIONS_FIELD_NUMBER: _ClassVar[int]
    MIRRORED_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    codec: str
    width: int
    height: int
    rotation: int
    avg_fps: float
    time_base: Rational
    duration_seconds: float
    frame_count: int
    keyframes: _containers.RepeatedScalarFieldContainer[int]
    pts: _containers.RepeatedScalarFieldContainer[int]
    stream: int
    pixel_format: str
    declared_frames: int
    display_width: int
    display_height: int
    durations: _containers.RepeatedScalarFieldContainer[int]
    mirrored: bool
    version: int
    def __init__(self, codec: _Optional[str] = ..., width: _Optional[int] = ..., height: _Optional[int] = ..., rotation: _Optional[int] = ..., avg_fps: _Optional[float] = ..., time_base: _Optional[_Union[Rational, _Mapping]] = ..., duration_seconds: _Optional[float] = ..., frame_count: _Optional[int] = ..., keyframes: _Optional[_Iterable[int]] = ..., pts: _Optional[_Iterable[int]] = ..., stream: _Optional[int] = ..., pixel_format: _Optional[str] = ..., declared_frames: _Optional[int] = ..., display_width: _Optional[int] = ..., display_height: _Optional[int] = ..., durations: _Optional[_Iterable[int]] = ..., mirrored: _Optional[bool] = ..., version: _Optional[int] = ...) -> None: ...

class FrameIndices(_message.Message):
    __slots__ = ("indices",)
    INDICES_FIELD_NUMBER: _ClassVar[int]
    indices: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, indices: _Optional[_Iterable[int]] = ...) -> None: ...

class Timestamps(_message.Message):
    __slots__ = ("seconds",)
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    seconds: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, seconds: _Optional[_Iterable[float]] = ...) -> None: ...

class ClipSpec(_message.Message):
    __slots__ = ("video", "frames", "times", "stream", "expect_version")
    VIDEO_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    TIMES_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    EXPECT_VERSION_FIELD_NUMBER: _ClassVar[int]
    video: str
    frames: FrameIndices
    times: Timestamps
    stream: int
    expect_version: int
    def __init__(self, video: _Optional[str] = ..., frames: _Optional[_Union[FrameIndices, _Mapping]] = ..., times: _Optional[_Union[Timestamps, _Mapping]] = ..., stream: _Optional[int] = ..., expect_version: _Optional[int] = ...) -> None: ...

class Size(_message.Message):
    __slots__ = ("width", "height")
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    width: int
    height: int
    def __init__(self, width: _Optional[int] = ..., height: _Optional[int] = ...) -> None: ...

class Transform(_message.Message):
    __slots__ = ("size", "short_side", "center_crop", "hflip", "dtype", "mean", "std", "layout", "no_rotate")
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SHORT_SIDE_FIELD_NUMBER: _ClassVar[int]
    CENTER_CROP_FIELD_NUMBER: _ClassVar[int]
    HFLIP_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    MEAN_FIELD_NUMBER: _ClassVar[int]
    STD_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    NO_ROTATE_FIELD_NUMBER: _ClassVar[int]
    size: Size
    short_side: int
    center_crop: Size
    hflip: bool
    dtype: DType
    mean: _containers.RepeatedScalarFieldContainer[float]
    std: _containers.RepeatedScalarFieldContainer[float]
    layout: Layout
    no_rotate: bool
    def __init__(self, size: _Optional[_Union[Size, _Mapping]] = ..., short_side: _Optional[int] = ..., center_crop: _Optional[_Union[Size, _Mapping]] = ..., hflip: _Optional[bool] = ..., dtype: _Optional[_Union[DType, str]] = ..., mean: _Optional[_Iterable[float]] = ..., std: _Optional[_Iterable[float]] = ..., layout: _Optional[_Union[Layout, str]] = ..., no_rotate: _Optional[bool] = ...) -> None: ...

class GetClipsRequest(_message.Message):
    __slots__ = ("dataset", "clips", "transform", "transport", "reuse_arena", "cache_policy")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    CLIPS_FIELD_NUMBER: _ClassVar[int]
    TRANSFORM_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    REUSE_ARENA_FIELD_NUMBER: _ClassVar[int]
    CACHE_POLICY_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    clips: _containers.RepeatedCompositeFieldContainer[ClipSpec]
    transform: Transform
    transport: Transport
    reuse_arena: bool
    cache_policy: CachePolicy
    def __init__(self, dataset: _Optional[str] = ..., clips: _Optional[_Iterable[_Union[ClipSpec, _Mapping]]] = ..., transform: _Optional[_Union[Transform, _Mapping]] = ..., transport: _Optional[_Union[Transport, str]] = ..., reuse_arena: _Optional[bool] = ..., cache_policy: _Optional[_Union[CachePolicy, str]] = ...) -> None: ...

class ClipInfo(_message.Message):
    __slots__ = ("video", "frame_indices", "pts", "pts_seconds", "label", "label_index", "sample", "clip", "replaced_by", "crop", "flipped", "duration_seconds")
    VIDEO_FIELD_NUMBER: _ClassVar[int]
    FRAME_INDICES_FIELD_NUMBER: _ClassVar[int]
    PTS_FIELD_NUMBER: _ClassVar[int]
    PTS_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    LABEL_INDEX_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    CLIP_FIELD_NUMBER: _ClassVar[int]
    REPLACED_BY_FIELD_NUMBER: _ClassVar[int]
    CROP_FIELD_NUMBER: _ClassVar[int]
    FLIPPED_FIELD_NUMBER: _ClassVar[int]
    DURATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    video: str
    frame_indices: _containers.RepeatedScalarFieldContainer[int]
    pts: _containers.RepeatedScalarFieldContainer[int]
    pts_seconds: _containers.RepeatedScalarFieldContainer[float]
    label: str
    label_index: int
    sample: int
    clip: int
    replaced_by: int
    crop: CropBox
    flipped: bool
    duration_seconds: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, video: _Optional[str] = ..., frame_indices: _Optional[_Iterable[int]] = ..., pts: _Optional[_Iterable[int]] = ..., pts_seconds: _Optional[_Iterable[float]] = ..., label: _Optional[str] = ..., label_index: _Optional[int] = ..., sample: _Optional[int] = ..., clip: _Optional[int] = ..., replaced_by: _Optional[int] = ..., crop: _Optional[_Union[CropBox, _Mapping]] = ..., flipped: _Optional[bool] = ..., duration_seconds: _Optional[_Iterable[float]] = ...) -> None: ...

class CropBox(_message.Message):
    __slots__ = ("x", "y", "width", "height")
    X_FIELD_NUMBER: _ClassVar[int]
    Y_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    x: int
    y: int
    width: int
    height: int
    def __init__(self, x: _Optional[int] = ..., y: _Optional[int] = ..., width: _Optional[int] = ..., height: _Optional[int] = ...) -> None: ...

class RequestStats(_message.Message):
    __slots__ = ("frames_decoded", "cache_hits", "cache_misses", "gop_runs", "shared_frames", "frames_skipped")
    FRAMES_DECODED_FIELD_NUMBER: _ClassVar[int]
    CACHE_HITS_FIELD_NUMBER: _ClassVar[int]
    CACHE_MISSES_FIELD_NUMBER: _ClassVar[int]
    GOP_RUNS_FIELD_NUMBER: _ClassVar[int]
    SHARED_FRAMES_FIELD_NUMBER: _ClassVar[int]
    FRAMES_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    frames_decoded: int
    cache_hits: int
    cache_misses: int
    gop_runs: int
    shared_frames: int
    frames_skipped: int
    def __init__(self, frames_decoded: _Optional[int] = ..., cache_hits: _Optional[int] = ..., cache_misses: _Optional[int] = ..., gop_runs: _Optional[int] = ..., shared_frames: _Optional[int] = ..., frames_skipped: _Optional[int] = ...) -> None: ...

class BatchHeader(_message.Message):
    __slots__ = ("shape", "dtype", "layout", "clips", "nbytes", "stats", "batch", "batches_total", "skipped", "shm", "samples_fingerprint")
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    CLIPS_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    BATCHES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    SHM_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: DType
    layout: Layout
    clips: _containers.RepeatedCompositeFieldContainer[ClipInfo]
    nbytes: int
    stats: RequestStats
    batch: int
    batches_total: int
    skipped: _containers.RepeatedCompositeFieldContainer[SkippedSample]
    shm: ShmSlot
    samples_fingerprint: int
    def __init__(self, shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[_Union[DType, str]] = ..., layout: _Optional[_Union[Layout, str]] = ..., clips: _Optional[_Iterable[_Union[ClipInfo, _Mapping]]] = ..., nbytes: _Optional[int] = ..., stats: _Optional[_Union[RequestStats, _Mapping]] = ..., batch: _Optional[int] = ..., batches_total: _Optional[int] = ..., skipped: _Optional[_Iterable[_Union[SkippedSample, _Mapping]]] = ..., shm: _Optional[_Union[ShmSlot, _Mapping]] = ..., samples_fingerprint: _Optional[int] = ...) -> None: ...

class ShmSlot(_message.Message):
    __slots__ = ("path", "arena", "slot", "offset", "arena_bytes", "slots")
    PATH_FIELD_NUMBER: _ClassVar[int]
    ARENA_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    ARENA_BYTES_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    path: str
    arena: str
    slot: int
    offset: int
    arena_bytes: int
    slots: int
    def __init__(self, path: _Optional[str] = ..., arena: _Optional[str] = ..., slot: _Optional[int] = ..., offset: _Optional[int] = ..., arena_bytes: _Optional[int] = ..., slots: _Optional[int] = ...) -> None: ...

class ReleaseSlotsRequest(_message.Message):
    __slots__ = ("arena", "slots")
    ARENA_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    arena: str
    slots: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, arena: _Optional[str] = ..., slots: _Optional[_Iterable[int]] = ...) -> None: ...

class ReleaseSlotsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SkippedSample(_message.Message):
    __slots__ = ("sample", "video", "code", "message")
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    VIDEO_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    sample: int
    video: str
    code: str
    message: str
    def __init__(self, sample: _Optional[int] = ..., video: _Optional[str] = ..., code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class GetClipsResponse(_message.Message):
    __slots__ = ("header", "offset", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: BatchHeader
    offset: int
    data: bytes
    def __init__(self, header: _Optional[_Union[BatchHeader, _Mapping]] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class ListDatasetsRequest(_message.Message):
    __slots__ = ("dataset", "omit_labels")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    OMIT_LABELS_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    omit_labels: bool
    def __init__(self, dataset: _Optional[str] = ..., omit_labels: _Optional[bool] = ...) -> None: ...

class DatasetInfo(_message.Message):
    __slots__ = ("name", "root", "video_count", "samples", "class_to_idx", "building", "samples_fingerprint")
    class ClassToIdxEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    VIDEO_COUNT_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    CLASS_TO_IDX_FIELD_NUMBER: _ClassVar[int]
    BUILDING_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    name: str
    root: str
    video_count: int
    samples: int
    class_to_idx: _containers.ScalarMap[str, int]
    building: bool
    samples_fingerprint: int
    def __init__(self, name: _Optional[str] = ..., root: _Optional[str] = ..., video_count: _Optional[int] = ..., samples: _Optional[int] = ..., class_to_idx: _Optional[_Mapping[str, int]] = ..., building: _Optional[bool] = ..., samples_fingerprint: _Optional[int] = ...) -> None: ...

class ListDatasetsResponse(_message.Message):
    __slots__ = ("datasets",)
    DATASETS_FIELD_NUMBER: _ClassVar[int]
    datasets: _containers.RepeatedCompositeFieldContainer[DatasetInfo]
    def __init__(self, datasets: _Optional[_Iterable[_Union[DatasetInfo, _Mapping]]] = ...) -> None: ...

class ReloadRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReloadResponse(_message.Message):
    __slots__ = ("datasets", "changed", "errors")
    DATASETS_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    datasets: _containers.RepeatedCompositeFieldContainer[DatasetInfo]
    changed: _containers.RepeatedScalarFieldContainer[str]
    errors: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, datasets: _Optional[_Iterable[_Union[DatasetInfo, _Mapping]]] = ..., changed: _Optional[_Iterable[str]] = ..., errors: _Optional[_Iterable[str]] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatsResponse(_message.Message):
    __slots__ = ("frames_decoded", "gop_runs", "cache_hits", "cache_misses", "cache_bytes", "cache_entries", "index_builds", "requests", "decode_queue_depth", "shared_frames", "frames_skipped", "active_streams", "inflight_requests", "samples_skipped", "batches_sent", "shm_arenas", "cache_admitted", "cache_bypassed", "frames_in_place", "decoders_opened", "decoders_reused")
    FRAMES_DECODED_FIELD_NUMBER: _ClassVar[int]
    GOP_RUNS_FIELD_NUMBER: _ClassVar[int]
    CACHE_HITS_FIELD_NUMBER: _ClassVar[int]
    CACHE_MISSES_FIELD_NUMBER: _ClassVar[int]
    CACHE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CACHE_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    INDEX_BUILDS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    DECODE_QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    SHARED_FRAMES_FIELD_NUMBER: _ClassVar[int]
    FRAMES_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_STREAMS_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    BATCHES_SENT_FIELD_NUMBER: _ClassVar[int]
    SHM_ARENAS_FIELD_NUMBER: _ClassVar[int]
    CACHE_ADMITTED_FIELD_NUMBER: _ClassVar[int]
    CACHE_BYPASSED_FIELD_NUMBER: _ClassVar[int]
    FRAMES_IN_PLACE_FIELD_NUMBER: _ClassVar[int]
    DECODERS_OPENED_FIELD_NUMBER: _ClassVar[int]
    DECODERS_REUSED_FIELD_NUMBER: _ClassVar[int]
    frames_decoded: int
    gop_runs: int
    cache_hits: int
    cache_misses: int
    cache_bytes: int
    cache_entries: int
    index_builds: int
    requests: int
    decode_queue_depth: int
    shared_frames: int
    frames_skipped: int
    active_streams: int
    inflight_requests: int
    samples_skipped: int
    batches_sent: int
    shm_arenas: int
    cache_admitted: int
    cache_bypassed: int
    frames_in_place: int
    decoders_opened: int
    decoders_reused: int
    def __init__(self, frames_decoded: _Optional[int] = ..., gop_runs: _Optional[int] = ..., cache_hits: _Optional[int] = ..., cache_misses: _Optional[int] = ..., cache_bytes: _Optional[int] = ..., cache_entries: _Optional[int] = ..., index_builds: _Optional[int] = ..., requests: _Optional[int] = ..., decode_queue_depth: _Optional[int] = ..., shared_frames: _Optional[int] = ..., frames_skipped: _Optional[int] = ..., active_streams: _Optional[int] = ..., inflight_requests: _Optional[int] = ..., samples_skipped: _Optional[int] = ..., batches_sent: _Optional[int] = ..., shm_arenas: _Optional[int] = ..., cache_admitted: _Optional[int] = ..., cache_bypassed: _Optional[int] = ..., frames_in_place: _Optional[int] = ..., decoders_opened: _Optional[int] = ..., decoders_reused: _Optional[int] = ...) -> None: ...

class ClipSampler(_message.Message):
    __slots__ = ("kind", "num_clips", "frames_per_clip", "frame_stride", "seconds_between_frames", "seconds_between_clip_starts", "range_start", "range_end", "short_video")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NUM_CLIPS_FIELD_NUMBER: _ClassVar[int]
    FRAMES_PER_CLIP_FIELD_NUMBER: _ClassVar[int]
    FRAME_STRIDE_FIELD_NUMBER: _ClassVar[int]
    SECONDS_BETWEEN_FRAMES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_BETWEEN_CLIP_STARTS_FIELD_NUMBER: _ClassVar[int]
    RANGE_START_FIELD_NUMBER: _ClassVar[int]
    RANGE_END_FIELD_NUMBER: _ClassVar[int]
    SHORT_VIDEO_FIELD_NUMBER: _ClassVar[int]
    kind: SamplerKind
    num_clips: int
    frames_per_clip: int
    frame_stride: int
    seconds_between_frames: float
    seconds_between_clip_starts: float
    range_start: float
    range_end: float
    short_video: ShortVideoPolicy
    def __init__(self, kind: _Optional[_Union[SamplerKind, str]] = ..., num_clips: _Optional[int] = ..., frames_per_clip: _Optional[int] = ..., frame_stride: _Optional[int] = ..., seconds_between_frames: _Optional[float] = ..., seconds_between_clip_starts: _Optional[float] = ..., range_start: _Optional[float] = ..., range_end: _Optional[float] = ..., short_video: _Optional[_Union[ShortVideoPolicy, str]] = ...) -> None: ...

class Augment(_message.Message):
    __slots__ = ("random_crop", "random_resized_crop", "random_hflip")
    RANDOM_CROP_FIELD_NUMBER: _ClassVar[int]
    RANDOM_RESIZED_CROP_FIELD_NUMBER: _ClassVar[int]
    RANDOM_HFLIP_FIELD_NUMBER: _ClassVar[int]
    random_crop: Size
    random_resized_crop: RandomResizedCrop
    random_hflip: bool
    def __init__(self, random_crop: _Optional[_Union[Size, _Mapping]] = ..., random_resized_crop: _Optional[_Union[RandomResizedCrop, _Mapping]] = ..., random_hflip: _Optional[bool] = ...) -> None: ...

class RandomResizedCrop(_message.Message):
    __slots__ = ("size", "scale_min", "scale_max", "ratio_min", "ratio_max")
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SCALE_MIN_FIELD_NUMBER: _ClassVar[int]
    SCALE_MAX_FIELD_NUMBER: _ClassVar[int]
    RATIO_MIN_FIELD_NUMBER: _ClassVar[int]
    RATIO_MAX_FIELD_NUMBER: _ClassVar[int]
    size: Size
    scale_min: float
    scale_max: float
    ratio_min: float
    ratio_max: float
    def __init__(self, size: _Optional[_Union[Size, _Mapping]] = ..., scale_min: _Optional[float] = ..., scale_max: _Optional[float] = ..., ratio_min: _Optional[float] = ..., ratio_max: _Optional[float] = ...) -> None: ...

class StreamBatchesRequest(_message.Message):
    __slots__ = ("dataset", "sampler", "transform", "augment", "batch_size", "drop_last", "seed", "epoch", "rank", "world_size", "start_batch", "prefetch", "no_shuffle", "shard_remainder", "on_error", "transport", "worker", "num_workers", "start_sample", "cache_policy", "samples_fingerprint")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    SAMPLER_FIELD_NUMBER: _ClassVar[int]
    TRANSFORM_FIELD_NUMBER: _ClassVar[int]
    AUGMENT_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    DROP_LAST_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    START_BATCH_FIELD_NUMBER: _ClassVar[int]
    PREFETCH_FIELD_NUMBER: _ClassVar[int]
    NO_SHUFFLE_FIELD_NUMBER: _ClassVar[int]
    SHARD_REMAINDER_FIELD_NUMBER: _ClassVar[int]
    ON_ERROR_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    NUM_WORKERS_FIELD_NUMBER: _ClassVar[int]
    START_SAMPLE_FIELD_NUMBER: _ClassVar[int]
    CACHE_POLICY_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    sampler: ClipSampler
    transform: Transform
    augment: Augment
    batch_size: int
    drop_last: bool
    seed: int
    epoch: int
    rank: int
    world_size: int
    start_batch: int
    prefetch: int
    no_shuffle: bool
    shard_remainder: ShardRemainder
    on_error: OnError
    transport: Transport
    worker: int
    num_workers: int
    start_sample: int
    cache_policy: CachePolicy
    samples_fingerprint: int
    def __init__(self, dataset: _Optional[str] = ..., sampler: _Optional[_Union[ClipSampler, _Mapping]] = ..., transform: _Optional[_Union[Transform, _Mapping]] = ..., augment: _Optional[_Union[Augment, _Mapping]] = ..., batch_size: _Optional[int] = ..., drop_last: _Optional[bool] = ..., seed: _Optional[int] = ..., epoch: _Optional[int] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ..., start_batch: _Optional[int] = ..., prefetch: _Optional[int] = ..., no_shuffle: _Optional[bool] = ..., shard_remainder: _Optional[_Union[ShardRemainder, str]] = ..., on_error: _Optional[_Union[OnError, str]] = ..., transport: _Optional[_Union[Transport, str]] = ..., worker: _Optional[int] = ..., num_workers: _Optional[int] = ..., start_sample: _Optional[int] = ..., cache_policy: _Optional[_Union[CachePolicy, str]] = ..., samples_fingerprint: _Optional[int] = ...) -> None: ...

class StreamBatchesResponse(_message.Message):
    __slots__ = ("header", "offset", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: BatchHeader
    offset: int
    data: bytes
    def __init__(self, header: _Optional[_Union[BatchHeader, _Mapping]] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class CheckDatasetRequest(_message.Message):
    __slots__ = ("dataset", "jobs", "shard_index", "shard_count")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    SHARD_INDEX_FIELD_NUMBER: _ClassVar[int]
    SHARD_COUNT_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    jobs: int
    shard_index: int
    shard_count: int
    def __init__(self, dataset: _Optional[str] = ..., jobs: _Optional[int] = ..., shard_index: _Optional[int] = ..., shard_count: _Optional[int] = ...) -> None: ...

class VideoHealth(_message.Message):
    __slots__ = ("video", "status", "frames", "decodable_frames", "first_bad_frame", "reason", "seconds")
    VIDEO_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    DECODABLE_FRAMES_FIELD_NUMBER: _ClassVar[int]
    FIRST_BAD_FRAME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    video: str
    status: str
    frames: int
    decodable_frames: int
    first_bad_frame: int
    reason: str
    seconds: float
    def __init__(self, video: _Optional[str] = ..., status: _Optional[str] = ..., frames: _Optional[int] = ..., decodable_frames: _Optional[int] = ..., first_bad_frame: _Optional[int] = ..., reason: _Optional[str] = ..., seconds: _Optional[float] = ...) -> None: ...

class CheckDatasetResponse(_message.Message):
    __slots__ = ("video", "done", "total")
    VIDEO_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    video: VideoHealth
    done: int
    total: int
    def __init__(self, video: _Optional[_Union[VideoHealth, _Mapping]] = ..., done: _Optional[int] = ..., total: _Optional[int] = ...) -> None: ...
