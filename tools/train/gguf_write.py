"""A minimal GGUF (version 3) writer: typed metadata, then F32/F16 tensors aligned to 32 bytes.

Written from the format description (ggml's docs/gguf.md): header, key-value pairs, tensor infos
(name, dims with ne0 first, type, offset into the data section), padding, data."""

import struct

import numpy as np

ALIGN = 32
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
GGML_F32, GGML_F16 = 0, 1


def _str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _value(kind, v):
    if kind == STR:
        return _str(v)
    if kind == BOOL:
        return struct.pack("<B", 1 if v else 0)
    fmt = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", U64: "Q", I64: "q", F64: "d"}
    return struct.pack("<" + fmt[kind], v)


class Writer:
    def __init__(self):
        self.kv = []  # (key, bytes)
        self.tensors = []  # (name, array, ggml type)

    def add(self, key, kind, value):
        self.kv.append((key, struct.pack("<I", kind) + _value(kind, value)))

    def add_array(self, key, kind, values):
        body = struct.pack("<IIQ", ARR, kind, len(values))
        if kind in (I32, U32, F32) and not isinstance(values, list):
            body += np.asarray(values, dtype={I32: "<i4", U32: "<u4", F32: "<f4"}[kind]).tobytes()
        else:
            body += b"".join(_value(kind, v) for v in values)
        self.kv.append((key, body))

    def add_tensor(self, name, array, ggml_type):
        a = np.ascontiguousarray(array, dtype=np.float32 if ggml_type == GGML_F32 else np.float16)
        self.tensors.append((name, a, ggml_type))

    def write(self, path):
        head = b"GGUF" + struct.pack("<IQQ", 3, len(self.tensors), len(self.kv))
        for key, body in self.kv:
            head += _str(key) + body
        offset, offsets = 0, []
        for name, a, t in self.tensors:
            offsets.append(offset)
            offset += a.nbytes
            offset += -offset % ALIGN
        for (name, a, t), off in zip(self.tensors, offsets):
            dims = list(reversed(a.shape))  # ggml order: ne0 is the fastest-moving axis
            head += _str(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
            head += struct.pack("<IQ", t, off)
        head += b"\0" * (-len(head) % ALIGN)
        with open(path, "wb") as f:
            f.write(head)
            for (name, a, t), off in zip(self.tensors, offsets):
                f.write(a.tobytes())
                f.write(b"\0" * (-a.nbytes % ALIGN))
