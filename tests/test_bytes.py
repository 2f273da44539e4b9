"""The one byte reader of the Python side (hvd_lossy/_bytes.py) is as strict as the native one
(frame_fields.h): every value has exactly one varint form, and no other bytes read as one."""
import pytest

from hvd_lossy import FrameError
from hvd_lossy._bytes import ByteReader, uvarint, varint


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 2 ** 32, 2 ** 63, 2 ** 64 - 1])
def test_unsigned_varints_round_trip_in_their_shortest_form(value):
    data = uvarint(value)
    assert len(data) == max(1, -(-value.bit_length() // 7))
    r = ByteReader(data + b"\x7f")
    assert r.uvarint() == value and r.left() == 1


@pytest.mark.parametrize("value", [0, -1, 1, -64, 64, 2 ** 40, -(2 ** 63), 2 ** 63 - 1])
def test_signed_varints_round_trip_by_zigzag(value):
    assert ByteReader(varint(value)).varint() == value
    assert len(varint(-1)) == 1


@pytest.mark.parametrize("data, why", [
    (b"\x80\x00", "overlong"),  # 0 in two bytes
    (b"\x81\x80\x00", "overlong"),  # 1 in three bytes
    (b"\xff" * 9 + b"\x02", "more than 64 bits"),
    (b"\xff" * 10 + b"\x01", "longer than 10 bytes"),
    (b"", "ends inside a varint"),
    (b"\x80\x80", "ends inside a varint"),
])
def test_a_varint_not_in_the_writers_form_is_refused(data, why):
    with pytest.raises(FrameError, match=why):
        ByteReader(data, what="the test bytes").uvarint()


def test_fixed_fields_and_bytes_refuse_truncation():
    r = ByteReader(b"\x01\x02\x03")
    assert r.u8() == 1
    with pytest.raises(FrameError, match="ends inside a 4-byte field"):
        r.u32()
    with pytest.raises(ValueError):
        uvarint(-1)
