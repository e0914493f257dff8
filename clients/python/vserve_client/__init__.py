"""Python client for the vserve daemon: frame-exact video clips as numpy arrays.

    from vserve_client import Client
    client = Client("unix:/run/vserve/vserve.sock")
    batch = client.get_clips("kin", [("a/b.mp4", [0, 5, 9])], short_side=224)
    batch.array            # uint8 [1, 3, H, W, 3]
    for batch in client.stream("kin", batch_size=32, num_frames_per_clip=8, seed=0, epoch=0):
        ...
    decoder = VideoDecoder(client, "kin", "a/b.mp4")   # TorchCodec's API
    decoder.get_frames_at([0, 5, 9]).data              # [3, 3, H, W]

Sizes are (height, width) everywhere in Python, as torchvision and TorchCodec; only the CLI says WxH.

Modules, in the order a batch passes them: :mod:`~vserve_client.request` (arguments -> messages),
:mod:`~vserve_client.client` (the gRPC calls), :mod:`~vserve_client.transport` (inline bytes or shared
memory), :mod:`~vserve_client.batch` (chunks -> one array), :mod:`~vserve_client.workers` (batches split
among data-loader workers), :mod:`vserve_client.torch` (the PyTorch dataset; imports torch),
:mod:`~vserve_client.decoder` (TorchCodec's VideoDecoder), :mod:`~vserve_client.bfloat16` and
:mod:`~vserve_client.dlpack` (client-side outputs), :mod:`~vserve_client.errors` (a class per gRPC status).
"""

from .batch import Batch
from .client import BatchStream, Client
from .decoder import Frame, FrameBatch, VideoDecoder, VideoStreamMetadata
from .errors import (
    Aborted,
    AlreadyExists,
    Cancelled,
    ClientClosed,
    DataLoss,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    OutOfRange,
    PermissionDenied,
    ProtocolError,
    ResourceExhausted,
    ShmUnreachable,
    Unauthenticated,
    Unavailable,
    Unimplemented,
    Unknown,
    VServeError,
)

__version__ = "0.1.0"

__all__ = [
    "Aborted",
    "AlreadyExists",
    "Batch",
    "BatchStream",
    "Cancelled",
    "Client",
    "ClientClosed",
    "Frame",
    "FrameBatch",
    "DataLoss",
    "DeadlineExceeded",
    "FailedPrecondition",
    "Internal",
    "InvalidArgument",
    "NotFound",
    "OutOfRange",
    "PermissionDenied",
    "ProtocolError",
    "ResourceExhausted",
    "ShmUnreachable",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "Unknown",
    "VServeError",
    "VideoDecoder",
    "VideoStreamMetadata",
]
