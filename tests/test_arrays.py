"""fairvfl_flwr/flower/arrays.py against Flower's own conversions: the same bytes out, the same
array back, the same refusals, whatever the dtype, shape, memory order or header a sender chose."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from fairvfl_flwr.flower.arrays import record_of, to_array, to_numpy

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


def test_what_flower_refuses_is_refused_with_flowers_error():
    good = Array(np.arange(5.0))
    short = Array(dtype=good.dtype, shape=good.shape, stype=good.stype, data=good.data[:-8])
    not_npy = Array(dtype=good.dtype, shape=good.shape, stype=good.stype, data=b"garbage" * 3)
    header = good.data[:good.data.index(b"\n") + 1]
    objects = Array(dtype="object", shape=(1,), stype=good.stype, data=header.replace(b"<f8", b"|O ") + b"\0" * 8)
    for bad in (short, not_npy, objects):
        with pytest.raises(ValueError) as theirs:
            bad.numpy()
        with pytest.raises(ValueError) as ours:
            to_numpy(bad)
        assert str(ours.value) == str(theirs.value)
    with pytest.raises(ValueError, match="Object arrays cannot be saved"):
        to_array(np.array([{}], dtype=object))


def test_a_sender_that_varies_its_headers_gets_the_right_arrays():
    arrays = [Array(np.arange(float(n))) for n in range(2_500)]  # more distinct headers than are kept
    assert all(np.array_equal(to_numpy(a), np.arange(float(n))) for n, a in enumerate(arrays))
    assert np.array_equal(to_numpy(arrays[3]), np.arange(3.0))


def test_a_record_of_arrays_is_flowers_record():
    arrays = {"a": to_array(RNG.random(4)), "b": to_array(np.arange(3))}
    ours, theirs = record_of(arrays), ArrayRecord(arrays)
    assert list(ours) == list(theirs) and ours.object_id == theirs.object_id
