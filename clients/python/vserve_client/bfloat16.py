"""bfloat16 without a bfloat16 type: float32 rounded to bfloat16 bit patterns held in ``uint16`` arrays.

NumPy has no bfloat16, so a bfloat16 batch is a ``uint16`` array of the values' bit patterns (the top
half of each float32's bits after rounding). :meth:`~vserve_client.Batch.to_torch` and DLPack hand it to
torch as ``torch.bfloat16`` without a copy; :func:`to_float32` widens it back (exactly: every bfloat16
value is a float32 value).

Rounding is IEEE round-to-nearest, ties to even, as torch's ``float.to(torch.bfloat16)`` (c10's
``round_to_nearest_even``): add ``0x7FFF`` plus the lowest kept bit, then drop the low 16 bits. Values
beyond bfloat16's largest finite value round to infinity as in IEEE; NaN becomes ``0x7FC0`` (torch's
canonical quiet NaN, sign dropped).
"""

from __future__ import annotations

import numpy as np

#: torch's bfloat16 NaN.
NAN_BITS = 0x7FC0

#: Elements converted per step: bounds the temporaries (two uint32 arrays of this length).
_STEP = 1 << 20


def from_float32(values: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (``uint16``, same shape, C order) of float32 ``values``, rounded to nearest
    even."""
    a = np.ascontiguousarray(values, dtype=np.float32)
    flat = a.reshape(-1).view(np.uint32)
    out = np.empty(flat.shape, dtype=np.uint16)
    for lo in range(0, flat.size, _STEP):
        bits = flat[lo : lo + _STEP]
        t = bits >> np.uint32(16)
        t &= np.uint32(1)
        t += np.uint32(0x7FFF)
        t += bits  # no overflow outside NaNs: the largest non-NaN pattern is -inf, 0xFF800000
        t >>= np.uint32(16)
        chunk = out[lo : lo + _STEP]
        chunk[...] = t
        nan = np.isnan(a.reshape(-1)[lo : lo + _STEP])
        if nan.any():
            chunk[nan] = NAN_BITS
    return out.reshape(a.shape)


def to_float32(bits: np.ndarray) -> np.ndarray:
    """float32 values of bfloat16 bit patterns (exact)."""
    b = np.asarray(bits)
    if b.dtype.itemsize != 2:
        raise TypeError(f"expected 16-bit bfloat16 patterns, got {b.dtype}")
    return (b.view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


__all__ = ["NAN_BITS", "from_float32", "to_float32"]
