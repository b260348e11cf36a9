"""NumPy arrays to and from Flower's ``Array``, each distinct ``.npy`` header written or parsed once.

Flower's ``Array(ndarray)`` runs ``np.save`` into a buffer and ``Array.numpy()`` runs
``np.load`` on one; for the small arrays a round carries (λ, a direction, step lengths, masks)
formatting or parsing the header is nearly all of the cost, about 30 µs a call against 1 µs for
the bytes. A run converts hundreds of thousands of them, in process and in every deployed
ClientApp. :func:`to_array` and :func:`to_numpy` keep each distinct header once and give
exactly what Flower's own conversions give: the same bytes, so the same object ids and
signatures, and a writable array of the same dtype, shape and memory order. Whatever they do
not handle (object or structured dtypes, another serialisation) goes to Flower's code. What
Flower refuses, and what it would only read by allocating what a header claims or would return
as something other than an array (an ``.npz`` archive), is refused with an
:class:`ArrayFormatError` that says why; the kept headers are bounded, since a message's headers
are the sender's choice.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping

import numpy as np
from flwr.app import Array, ArrayRecord

_NUMPY = "numpy.ndarray"  # flwr's SType.NUMPY
_KEPT = 1024  # headers kept per direction; a sender that varies them only costs the slow path

_VERSIONS = ((1, 0), (2, 0))  # the .npy versions parsed here; (3, 0) (utf-8 field names) is Flower's

_written: dict[tuple, bytes] = {}
_read: dict[bytes, tuple[np.dtype, tuple[int, ...], bool]] = {}


class ArrayFormatError(ValueError):
    """An array in a message that is not one NumPy array of the bytes its header declares."""


def _plain(dtype: np.dtype) -> bool:
    return dtype.fields is None and not dtype.hasobject and dtype.subdtype is None and dtype.itemsize > 0


def to_array(x: np.ndarray) -> Array:
    """``Array(x)``: the same dtype, shape and bytes."""
    if type(x) is not np.ndarray or not _plain(x.dtype):  # a subclass (masked, matrix) is np.save's to write
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
    """``a.numpy()``: a writable array of the same dtype, shape, order and values; an
    :class:`ArrayFormatError` for what Flower refuses or would not return as one array."""
    start = _data_start(a.data) if a.stype == _NUMPY else 0
    header = a.data[:start] if start and tuple(a.data[6:8]) in _VERSIONS else b""
    if not header:
        return _flowers(a)
    parsed = _read.get(header)
    if parsed is None:
        parsed = _parsed(header)
        if len(_read) >= _KEPT:
            _read.clear()
        _read[header] = parsed
    dtype, shape, fortran = parsed
    count = math.prod(shape)
    if len(a.data) - start < count * dtype.itemsize:  # before Flower allocates what the header claims
        raise ArrayFormatError(f"an array's .npy header declares {dtype.str} of shape {shape}, "
                               f"{count * dtype.itemsize} bytes, and the message holds {len(a.data) - start}")
    if not _plain(dtype):
        return _flowers(a)
    flat = np.frombuffer(a.data, dtype=dtype, count=count, offset=start)
    x = flat.reshape(shape[::-1]).T if fortran else flat.reshape(shape)
    return x.copy(order="K")


def _parsed(header: bytes) -> tuple[np.dtype, tuple[int, ...], bool]:
    fp = io.BytesIO(header)
    version = np.lib.format.read_magic(fp)
    reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    try:
        shape, fortran, dtype = reader(fp)
    except ValueError as exc:
        raise ArrayFormatError(f"an array's .npy header is not one NumPy reads: {exc}") from None
    if any(d < 0 for d in shape):
        raise ArrayFormatError(f"an array's .npy header declares the shape {shape}: negative dimensions are "
                               "not allowed")
    return dtype, shape, fortran


def _flowers(a: Array) -> np.ndarray:
    """``a.numpy()`` for what is not parsed here, its refusals as :class:`ArrayFormatError`."""
    try:
        x = a.numpy()
    except (ValueError, TypeError, EOFError, OSError, MemoryError, SyntaxError) as exc:
        raise ArrayFormatError(f"an array Flower cannot read ({a.stype}, dtype {a.dtype!r}): {exc}") from None
    if not isinstance(x, np.ndarray):
        close = getattr(x, "close", None)
        if close is not None:
            close()
        raise ArrayFormatError(f"an array whose bytes are a {type(x).__name__}, not one .npy array")
    return x


def record_of(arrays: Mapping[str, Array]) -> ArrayRecord:
    """``ArrayRecord(arrays)``, without the copy of every ``Array`` Flower's constructor makes."""
    record = ArrayRecord()
    for key, array in arrays.items():
        record[key] = array
    return record
