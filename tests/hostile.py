"""Hostile pickles for the deserialisation sites' tests: each, loaded by a plain
unpickler, creates a marker file (``touch``), so a test proves nothing ran by that file's
absence. Shapes: a protocol-2 ``GLOBAL`` naming ``os.system``, a protocol-4 ``STACK_GLOBAL``
naming ``builtins.eval``, a dotted ``STACK_GLOBAL`` name resolved through an allowed
module's globals (``torch.serialization.os.system``, as in issue 53's sharded manifest),
and a ``REDUCE`` nested inside an ordinary-looking state dict.

``as_torch_file`` wraps one in ``torch.save``'s zip format, as a ``state.pt`` or a
Lightning ``.ckpt`` would be.
"""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from pathlib import Path


def _str(text: str) -> bytes:
    raw = text.encode()
    return b"X" + len(raw).to_bytes(4, "little") + raw  # BINUNICODE (torch's weights-only reader knows it)


def _stack_global_call(module: str, name: str, arg: str) -> bytes:
    """``module.name(arg)`` as protocol-4 opcodes (no STOP)."""
    return _str(module) + _str(name) + b"\x93" + _str(arg) + b"\x85" + b"R"  # STACK_GLOBAL, TUPLE1, REDUCE


class _Call:
    def __init__(self, fn, arg):
        self.fn, self.arg = fn, arg

    def __reduce__(self):
        return (self.fn, (self.arg,))


def hostile_pickles(marker: Path) -> dict[str, bytes]:
    """Name -> pickle bytes; each would create ``marker``."""
    command = f"touch {marker}"
    code = f"__import__('os').system({command!r})"
    return {
        "global_os_system": pickle.dumps(_Call(os.system, command), protocol=2),
        "stack_global_builtins_eval": b"\x80\x04" + _stack_global_call("builtins", "eval", code) + b".",
        "dotted_stack_global": b"\x80\x04" + _stack_global_call("torch", "serialization.os.system", command) + b".",
        "nested_reduce": pickle.dumps(
            {"model": {"weight": [1.0, 2.0], "step": 3}, "opt": {"state": {0: {"buf": _Call(os.system, command)}}}},
            protocol=2,
        ),
    }


def as_torch_file(payload: bytes) -> bytes:
    """``payload`` as the pickle of a file in ``torch.save``'s zip format."""
    import torch

    plain = io.BytesIO()
    torch.save({}, plain)
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(plain.getvalue())) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for item in src.infolist():
            data = payload if item.filename.endswith("/data.pkl") else src.read(item.filename)
            dst.writestr(item.filename, data)
    return out.getvalue()
