"""fairvfl_flwr/flower/arrays.py against Flower's own conversions: the same bytes out, the same
array back, the same refusals, whatever the dtype, shape, memory order or header a sender chose."""

import io
import re

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from fairvfl_flwr.flower.arrays import ArrayFormatError, record_of, to_array, to_numpy

RNG = np.random.default_rng(0)
ARRAYS = {
    "0-d": np.array(7.5), "empty": np.array([]), "no rows": np.zeros((0, 3)), "vector": RNG.random(5),
    "matrix": RNG.random((4, 3)), "fortran": np.asfortranarray(RNG.random((4, 3))),
    "strided": RNG.random((6, 4))[::2, 1:], "int32": RNG.integers(0, 9, (3, 2)).astype(np.int32),
    "bool": np.array([True, False, True]), "text": np.array(["ab", "c"]), "bytes": np.array([b"ab", b"c"]),
    "big-endian": RNG.random(3).astype(">f8"), "float32 3-d": RNG.random((2, 3, 4)).astype(np.float32),
    "fortran 3-d": np.asfortranarray(RNG.random((2, 3, 4))), "uint8": np.arange(7, dtype=np.uint8),
}


@pytest.mark.parametrize("name", list(ARRAYS))
def test_an_array_has_flowers_bytes_and_comes_back_as_flowers_numpy_gives_it(name):
    x = ARRAYS[name]
    for _ in range(2):  # the first call finds the header, the second reuses it
        ours, theirs = to_array(x), Array(x)
        assert (ours.dtype, ours.shape, ours.stype, ours.data) == (theirs.dtype, theirs.shape, theirs.stype, theirs.data)
        assert ours.object_id == theirs.object_id
        got, want = to_numpy(theirs), theirs.numpy()
        assert got.dtype == want.dtype and got.shape == want.shape
        assert (got.flags.c_contiguous, got.flags.f_contiguous) == (want.flags.c_contiguous, want.flags.f_contiguous)
        assert np.array_equal(got, want) and got.flags.writeable
        got[...] = 0 if got.size else got  # a copy: the message's bytes stay as they came
        assert to_numpy(theirs).tobytes() == want.tobytes()


def _with(good: Array, data: bytes, dtype: str | None = None) -> Array:
    return Array(dtype=dtype or good.dtype, shape=good.shape, stype=good.stype, data=data)


def _npy(text: str, body: bytes) -> bytes:
    """A version 1.0 .npy of this header text, padded as np.save pads one, then ``body``."""
    text = text.encode("latin1")
    pad = -(10 + len(text) + 1) % 64
    return b"\x93NUMPY\x01\x00" + (len(text) + pad + 1).to_bytes(2, "little") + text + b" " * pad + b"\n" + body


def test_what_flower_refuses_is_refused_and_the_error_says_why():
    good = Array(np.arange(4.0))
    header = good.data[:good.data.index(b"\n") + 1]
    body = good.data[len(header):]
    zipped = io.BytesIO()
    np.savez(zipped, x=np.arange(4.0))
    refused = {
        "short": (_with(good, good.data[:-8]), "declares <f8 of shape (4,), 32 bytes, and the message holds 24"),
        "not npy": (_with(good, b"garbage" * 3), "cannot read"),
        "objects": (_with(good, _npy("{'descr': '|O', 'fortran_order': False, 'shape': (4,), }", body), "object"),
                    "allow_pickle=False"),
        "negative": (_with(good, _npy("{'descr': '<f8', 'fortran_order': False, 'shape': (-4,), }", body)),
                     "negative dimensions"),
        "negative 2-d": (_with(good, _npy("{'descr': '<f8', 'fortran_order': False, 'shape': (2, -1), }", body)),
                         "negative dimensions"),
        "version 2.7": (_with(good, good.data[:6] + b"\x02\x07" + good.data[8:]), "cannot read"),
        "expression": (_with(good, _npy("{'descr': '<f8', 'fortran_order': False, 'shape': (2*2,), }", body)),
                       "header is not one NumPy reads"),
        "an npz": (_with(good, zipped.getvalue()), "not one .npy array"),
        "huge": (_with(good, _npy("{'descr': '|u1', 'fortran_order': False, 'shape': (10000000000000,), }", b"\0")),
                 "the message holds 1"),
    }
    for name, (bad, why) in refused.items():
        with pytest.raises(Exception):  # Flower refuses it too, or reads the bytes another way
            x = bad.numpy()
            assert isinstance(x, np.ndarray) and x.shape == (4,) and name != "huge", name
        with pytest.raises(ArrayFormatError, match=re.escape(why)):
            to_numpy(bad)
    with pytest.raises(ValueError, match="Object arrays cannot be saved"):
        to_array(np.array([{}], dtype=object))


def test_what_flower_reads_that_is_not_a_plain_number_array_is_read_as_flower_reads_it():
    empty_items = Array(np.zeros(3, dtype="|S0"))  # np.save writes it; np.frombuffer cannot take item size 0
    assert np.array_equal(to_numpy(empty_items), empty_items.numpy())
    masked = np.ma.array([1.0, 2.0, 3.0], mask=[0, 1, 0])
    to_array(np.arange(3.0))  # its header kept
    assert to_array(masked).data == Array(masked).data  # np.save's bytes of the data under the mask


def test_a_sender_that_varies_its_headers_gets_the_right_arrays():
    arrays = [Array(np.arange(float(n))) for n in range(2_500)]  # more distinct headers than are kept
    assert all(np.array_equal(to_numpy(a), np.arange(float(n))) for n, a in enumerate(arrays))
    assert np.array_equal(to_numpy(arrays[3]), np.arange(3.0))


def test_a_record_of_arrays_is_flowers_record():
    arrays = {"a": to_array(RNG.random(4)), "b": to_array(np.arange(3))}
    ours, theirs = record_of(arrays), ArrayRecord(arrays)
    assert list(ours) == list(theirs) and ours.object_id == theirs.object_id
