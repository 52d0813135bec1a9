from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

from statekit.stores import get_serde, register_serde
from statekit.stores.serdes import JsonSerde, decode_column

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children,
                                                                      max_size=4),
    max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_json_round_trip(v):
    s = get_serde("json")
    assert s.from_bytes(s.to_bytes(v)) == v


@given(st.dictionaries(st.text(), st.integers(), min_size=2, max_size=6))
def test_json_equal_values_give_equal_bytes(d):
    s = get_serde("json")
    rev = dict(reversed(list(d.items())))
    assert s.to_bytes(rev) == s.to_bytes(d)


def test_json_is_compact_and_sorted():
    s = get_serde()
    assert s.to_bytes({"b": 1, "a": [1, 2]}) == b'{"a":[1,2],"b":1}'
    assert s.to_bytes(7) == b"7"
    assert s.to_bytes(True) == b"true"
    assert s.to_bytes("é") == b'"\\u00e9"'
    assert s.from_bytes(b"-12") == -12


def test_json_nan_round_trips():
    s = get_serde("json")
    assert math.isnan(s.from_bytes(s.to_bytes(float("nan"))))


@given(st.text())
def test_str_round_trip(v):
    s = get_serde("str")
    assert s.from_bytes(s.to_bytes(v)) == v


@given(st.integers(min_value=-(2 ** 63), max_value=2 ** 63 - 1))
def test_int64_round_trip(v):
    s = get_serde("int64")
    b = s.to_bytes(v)
    assert len(b) == 8 and s.from_bytes(b) == v


@given(st.integers(0, 2 ** 63 - 1), st.integers(0, 2 ** 63 - 1))
def test_int64_byte_order_is_numeric_order(a, b):
    s = get_serde("int64")
    assert (s.to_bytes(a) < s.to_bytes(b)) == (a < b)


def test_int64_is_big_endian_signed():
    s = get_serde("int64")
    assert s.to_bytes(1) == b"\x00" * 7 + b"\x01"
    assert s.to_bytes(-1) == b"\xff" * 8


@given(st.binary())
def test_bytes_identity(v):
    s = get_serde("bytes")
    assert s.from_bytes(s.to_bytes(v)) == v
    assert s.to_bytes(bytearray(v)) == v


def test_pluggable_objects_and_names():
    class Upper:
        def to_bytes(self, o):
            return o.upper().encode()

        def from_bytes(self, b):
            return b.decode().lower()

    u = Upper()
    assert get_serde(u) is u
    register_serde("test-upper", u)
    assert get_serde("test-upper") is u
    assert get_serde(None) is get_serde("json")
    assert isinstance(get_serde("json"), JsonSerde)


def test_bad_serdes_fail_clearly():
    with pytest.raises(ValueError, match="unknown serde 'pickle'"):
        get_serde("pickle")
    with pytest.raises(TypeError, match="not a serde"):
        get_serde(42)
    with pytest.raises(TypeError):
        register_serde("x", object())


def test_json_number_decoding_matches_json():
    s = get_serde("json")
    for raw in [b"0", b"-0", b"12", b"-7", b"1.5", b"1e5", b"-1.25E-3", b"123456789012345678901234567890",
                b"-Infinity", b"Infinity", b"true", b"null", b'"3"']:
        got = s.from_bytes(raw)
        want = __import__("json").loads(raw)
        assert got == want or (got != got and want != want)
        assert type(got) is type(want)


_json_docs = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(-(2 ** 70), 2 ** 70)
    | st.floats() | st.text() | st.sampled_from([1e400, -1e400, 1e16, 1e-7, -0.0, 2 ** 64, -(2 ** 63) - 1]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children,
                                                                      max_size=4),
    max_leaves=12)


@settings(max_examples=400, deadline=None)
@given(_json_docs, st.sampled_from(["", " ", "\n", "\t "]), st.booleans(), st.booleans())
def test_json_decoding_is_what_json_decodes(v, pad, ascii_only, compact):
    """Any JSON document another producer may write (spaces or not, escaped or raw UTF-8, big
    integers, NaN, infinities, padding) decodes to exactly what json.loads gives (type and value),
    one value at a time and column-wise, and what json refuses is refused with json's error."""
    import json

    text = json.dumps(v, ensure_ascii=ascii_only, separators=(",", ":") if compact else None)
    raw = (pad + text + pad).encode("utf-8", "surrogatepass")
    try:
        want = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        with pytest.raises(type(exc)):
            get_serde("json").from_bytes(raw)
        return
    got = get_serde("json").from_bytes(raw)
    assert repr(got) == repr(want)
    col = decode_column(get_serde("json"), [raw, raw])   # the bulk path's: all, or None
    assert col is None or repr(col) == repr([want, want])


def test_json_decoding_refuses_what_json_refuses():
    s = get_serde("json")
    for raw in [b"", b"{", b'{"a":1}x', b"[1,]", b"\xff", b"nul"]:
        with pytest.raises(ValueError):
            s.from_bytes(raw)
