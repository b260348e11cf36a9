"""NumPy arrays to and from Flower's ``Array``, each distinct ``.npy`` header written or parsed once.

Flower's ``Array(ndarray)`` runs ``np.save`` into a buffer and ``Array.numpy()`` runs
``np.load`` on one; for the small arrays a round carries (λ, a direction, step lengths, masks)
formatting or parsing the header is nearly all of the cost, about 30 µs a call against 1 µs for
the bytes. A run converts hundreds of thousands of them, in process and in every deployed
ClientApp. :func:`to_array` and :func:`to_numpy` keep each distinct header once and give
exactly what Flower's own conversions give: the same bytes, so the same object ids and
signatures, and a writable array of the same dtype, shape and memory order. Whatever they do
not handle (object or structured dtypes, another serialisation) goes to Flower's code, which
refuses what it refuses; the kept headers are bounded, since a message's headers are the
sender's choice.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping

import numpy as np
from flwr.app import Array, ArrayRecord

_NUMPY = "numpy.ndarray"  # flwr's SType.NUMPY
_KEPT = 1024  # headers kept per direction; a sender that varies them only costs the slow path

_written: dict[tuple, bytes] = {}
_read: dict[bytes, tuple[np.dtype, tuple[int, ...], bool]] = {}


def _plain(dtype: np.dtype) -> bool:
    return dtype.fields is None and not dtype.hasobject and dtype.subdtype is None


def to_array(x: np.ndarray) -> Array:
    """``Array(x)``: the same dtype, shape and bytes."""
    if not isinstance(x, np.ndarray) or not _plain(x.dtype):
        return Array(x)
    fortran = x.flags.f_contiguous and not x.flags.c_contiguous  # np.save's rule
    key = (x.dtype, x.shape, fortran)
    header = _written.get(key)
    if header is None:
        whole = Array(x)
        if len(_written) >= _KEPT:
            _written.clear()
        _written[key] = whole.data[: _data_start(whole.data)]
        return whole
    body = x.T.tobytes() if fortran else x.tobytes()
    return Array(dtype=str(x.dtype), shape=tuple(x.shape), stype=_NUMPY, data=header + body)


def _data_start(data: bytes) -> int:
    """Where the array's bytes begin after the ``.npy`` magic, version and header (0: not one)."""
    if len(data) < 10 or data[:6] != b"\x93NUMPY":
        return 0
    if data[6] == 1:
        return 10 + int.from_bytes(data[8:10], "little")
    if data[6] in (2, 3) and len(data) >= 12:
        return 12 + int.from_bytes(data[8:12], "little")
    return 0


def to_numpy(a: Array) -> np.ndarray:
    """``a.numpy()``: a writable array of the same dtype, shape, order and values."""
    start = _data_start(a.data) if a.stype == _NUMPY else 0
    header = a.data[:start] if start and a.data[6] != 3 else b""  # version 3 (utf-8 names): Flower's
    parsed = _read.get(header) if header else None
    if header and parsed is None:
        fp = io.BytesIO(header)
        version = np.lib.format.read_magic(fp)
        reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        try:
            shape, fortran, dtype = reader(fp)
        except ValueError:
            return a.numpy()  # Flower's own refusal of the header
        if not _plain(dtype):
            return a.numpy()
        parsed = (dtype, shape, fortran)
        if len(_read) >= _KEPT:
            _read.clear()
        _read[header] = parsed
    if parsed is None:
        return a.numpy()
    dtype, shape, fortran = parsed
    count = math.prod(shape)
    if len(a.data) - start < count * dtype.itemsize:
        return a.numpy()  # Flower's own error for a short buffer
    flat = np.frombuffer(a.data, dtype=dtype, count=count, offset=start)
    x = flat.reshape(shape[::-1]).T if fortran else flat.reshape(shape)
    return x.copy(order="K")


def record_of(arrays: Mapping[str, Array]) -> ArrayRecord:
    """``ArrayRecord(arrays)``, without the copy of every ``Array`` Flower's constructor makes."""
    record = ArrayRecord()
    for key, array in arrays.items():
        record[key] = array
    return record
