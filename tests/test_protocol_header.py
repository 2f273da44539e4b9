"""The alltoall's compact protocol header: the same fields as the fixed "HVL2" header in about a
tenth of its bytes, one length for every destination of a call."""
import numpy as np
import pytest

from hvd_lossy import protocol as P


def fields(status=0, a=0, b=0, grank=1, dtype=0, ndim=3, rows=64, payload=7000,
           pending=(0, 0, 0), settings=0x5EED1234, dims=(26, 32)):
    return ([P.MAGIC, status, a, b, grank, dtype, ndim, rows, payload, *pending, settings]
            + (list(dims) + [-1] * P.MAX_NDIM)[:P.MAX_NDIM])


@pytest.mark.parametrize("f", [
    fields(),
    fields(status=3, a=2 ** 40, b=-5, rows=0, payload=0),
    fields(dtype=-1, ndim=-1, dims=()),  # a failure header of something that is not a tensor
    fields(ndim=1, dims=(), pending=(10, 3, 12345)),
    fields(ndim=8, dims=(1, 2, 3, 4, 5, 6, 7)),
    fields(settings=0x7FFFFFFF),  # the widest settings digest
])
def test_compact_header_round_trips_every_field(f):
    buf = np.zeros(200, dtype=np.uint8)
    n = P.pack_compact(f, buf, 5)
    assert n == P.compact_size(f) == len(P.compact_bytes(f))
    got, m = P.parse_compact(buf, 5, 195, source=0)
    assert (got, m) == (f, n)


def test_compact_header_is_a_fraction_of_the_fixed_one():
    # 35 bytes with a 2-d row shape and the widest settings digest: under a quarter of 168
    assert P.compact_size(fields(settings=0x7FFFFFFF)) <= 40 < P.HEADER_BYTES // 4


def test_its_length_is_the_same_whatever_rows_and_payload():
    assert P.compact_size(fields(rows=0, payload=0)) == P.compact_size(fields(rows=2 ** 40, payload=2 ** 31))


@pytest.mark.parametrize("cut", [0, 1, 2, 10])
def test_truncated_or_foreign_bytes_are_a_receive_failure(cut):
    data = np.frombuffer(P.compact_bytes(fields()), dtype=np.uint8).copy()
    with pytest.raises(P._LocalError) as e:
        P.parse_compact(data[:cut], 0, cut, source=1)
    assert e.value.code == 10
    data[0] ^= 0xFF
    with pytest.raises(P._LocalError):
        P.parse_compact(data, 0, len(data), source=1)
