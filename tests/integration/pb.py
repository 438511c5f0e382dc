"""Just enough protobuf encoding (stdlib only) to craft psd.v1 requests the
well-behaved clients never send: `pstool raw METHOD HEX` carries them. Field
numbers follow proto/ps.proto."""
import struct


def varint(n):
    n &= (1 << 64) - 1  # negative int32/int64 travel as 64-bit two's complement
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def key(field, wire_type):
    return varint(field << 3 | wire_type)


def uint(field, n):
    return key(field, 0) + varint(n) if n else b""


def ld(field, data):
    """A length-delimited field: bytes, a string or a nested message."""
    if isinstance(data, str):
        data = data.encode()
    return key(field, 2) + varint(len(data)) + data


def packed(field, values):
    return ld(field, b"".join(varint(v) for v in values)) if values else b""


def caller(job, worker="test"):
    return ld(1, ld(1, job) + ld(2, worker))


def segment(name, offset, count, shape=()):
    return ld(1, name) + uint(2, offset) + uint(3, count) + packed(4, shape)


def bf16(x):
    """The bfloat16 bits nearest to float x, ties to even (bf16.h)."""
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    return ((u + 0x7fff + ((u >> 16) & 1)) >> 16) & 0xffff


def push(job, segments, floats, step=0, worker=0, dtype=0):
    """segments: a list of (name, offset, count, shape) tuples; dtype 1
    sends the gradient as bfloat16 (PushRequest.dtype BF16)."""
    body = caller(job) if job else b""
    for s in segments:
        body += ld(2, segment(*s))
    body += uint(3, 1) + uint(4, step) + uint(5, worker)
    if dtype:
        return body + uint(44, dtype) + ld(15, struct.pack(
            "<%dH" % len(floats), *[bf16(x) for x in floats]))
    return body + ld(15, struct.pack("<%df" % len(floats), *floats))


def pull(job, segments, min_version=0, dtype=0):
    body = caller(job)
    for s in segments:
        body += ld(2, segment(*s))
    return body + uint(3, min_version) + (uint(63, dtype) if dtype else b"")


def var_spec(name, shape, placement=-1, optimizer="", init=0, init_scale=0.0, seed=0):
    """A VarSpec; optimizer is VarSpec.optimizer's JSON text ("" = the spec's)."""
    body = ld(1, name) + packed(2, shape)
    body += key(3, 0) + varint(placement) if placement else b""
    body += uint(4, init)
    if init_scale:
        body += key(5, 5) + struct.pack("<f", init_scale)
    return body + uint(6, seed) + (ld(7, optimizer) if optimizer else b"")


def declare(job, specs):
    """A DeclareRequest of var_spec() messages."""
    return caller(job) + b"".join(ld(2, s) for s in specs)


def commit(job, step, applied=(), dropped=()):
    return caller(job) + uint(2, step) + packed(3, applied) + packed(4, dropped)


def fields(msg):
    """Decodes one message's top-level fields: {number: [value, ...]}, a
    varint or a fixed64/fixed32 as an int, a length-delimited field as
    bytes (enough to read a PullResponse or a Caller)."""
    out, i = {}, 0

    def read_varint():
        nonlocal i
        n, shift = 0, 0
        while True:
            b = msg[i]
            i += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return n

    while i < len(msg):
        k = read_varint()
        field, wire_type = k >> 3, k & 7
        if wire_type == 0:
            v = read_varint()
        elif wire_type == 2:
            n = read_varint()
            v, i = bytes(msg[i:i + n]), i + n
        elif wire_type in (1, 5):  # fixed64, fixed32: little-endian
            n = 8 if wire_type == 1 else 4
            v, i = int.from_bytes(msg[i:i + n], "little"), i + n
        else:
            raise ValueError("wire type %d at byte %d" % (wire_type, i))
        out.setdefault(field, []).append(v)
    return out


def hexa(msg):
    return msg.hex()
