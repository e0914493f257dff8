"""A DLPack exporter for host arrays NumPy cannot export itself: bfloat16 bit patterns held in ``uint16``.

``Batch.__dlpack__`` hands uint8/float16/float32 arrays to NumPy's own ``__dlpack__``; a bfloat16 batch
(see :mod:`vserve_client.bfloat16`) goes through :func:`capsule`, which builds the classic (unversioned)
``DLManagedTensor`` with dtype code ``kDLBfloat`` over the array's memory, so ``torch.from_dlpack(batch)``
is a ``torch.bfloat16`` tensor on the same bytes, no copy.

Lifetime: the array (and the shape/stride buffers) are kept in a registry until the consumer calls the
tensor's deleter, or, for a capsule nobody consumed, until the capsule is destroyed.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Dict, Tuple

import numpy as np

KDL_CPU = 1
KDL_BFLOAT = 4

#: Capsule names of the DLPack protocol: a producer's, and what a consumer renames it to once it owns it.
_NAME = b"dltensor"


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _Managed(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_Managed._fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]

_CapsuleDestructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _CapsuleDestructor]
_capsule_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_is_valid.restype = ctypes.c_int
_capsule_is_valid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]

#: Address of each live DLManagedTensor -> what must outlive it (the struct, shape/strides, the array).
_live: Dict[int, Tuple[Any, ...]] = {}
_lock = threading.Lock()


def _release(address: int) -> None:
    with _lock:
        _live.pop(address, None)


@_Deleter
def _deleter(address: int) -> None:  # called by the consumer (any thread; ctypes takes the GIL)
    _release(address)


@_CapsuleDestructor
def _destructor(capsule: int) -> None:
    # A consumer that took the tensor renamed the capsule ("used_dltensor") and calls the deleter itself.
    if _capsule_is_valid(capsule, _NAME):
        _release(_capsule_pointer(capsule, _NAME))


def live_tensors() -> int:
    """How many exported tensors are still alive (for tests: 0 once consumers freed theirs)."""
    with _lock:
        return len(_live)


def capsule(array: np.ndarray, code: int = KDL_BFLOAT) -> Any:
    """A ``dltensor`` capsule over ``array``'s memory (a CPU array of 2-byte elements read as ``code``:
    bfloat16 by default), keeping ``array`` alive while the tensor lives."""
    if array.dtype.itemsize != 2:
        raise BufferError(f"expected 16-bit elements, got {array.dtype}")
    if any(s % array.itemsize for s in array.strides):
        raise BufferError(f"strides {array.strides} are not whole elements")
    ndim = array.ndim
    shape = (ctypes.c_int64 * max(ndim, 1))(*array.shape)
    strides = (ctypes.c_int64 * max(ndim, 1))(*(s // array.itemsize for s in array.strides))
    managed = _Managed()
    managed.dl_tensor.data = array.ctypes.data
    managed.dl_tensor.device = _Device(KDL_CPU, 0)
    managed.dl_tensor.ndim = ndim
    managed.dl_tensor.dtype = _DataType(code, 16, 1)
    managed.dl_tensor.shape = shape
    managed.dl_tensor.strides = strides
    managed.dl_tensor.byte_offset = 0
    managed.manager_ctx = None
    managed.deleter = _deleter
    address = ctypes.addressof(managed)
    with _lock:
        _live[address] = (managed, shape, strides, array)
    return _capsule_new(address, _NAME, _destructor)


__all__ = ["KDL_BFLOAT", "KDL_CPU", "capsule", "live_tensors"]
