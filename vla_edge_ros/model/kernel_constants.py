"""The numbers the kernels and their Python callers must agree on, read from cuda/common.cuh.

common.cuh is the one place they are written (`#define CTL_TOKEN 3`, `#define PMODE_ADD 1`);
Python reads them from there instead of repeating them, so a change on one side cannot
leave the other behind. They are module attributes, looked up on first use:

    from vla_edge_ros.model import kernel_constants as kc
    kc.MODE_ADD, kc.CTL_INTS

The header is parsed lazily (module `__getattr__`, PEP 562) because importing the model
must not read files: a numpy-only install may not even find the kernel directory, and
kernel_reference.py (which uses these) must import without PyCUDA or a GPU.
cuda_kernels.py and kernel_reference.py re-export the same names through `reexport`.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path

from ..resources import kernel_dir

HEADER = "common.cuh"

# Python name -> its #define in common.cuh. The C side prefixes the projection modes with P
# (PMODE_ADD) so they cannot collide with a kernel's own MODE_* macros.
HEADER_NAMES = {
    "CTL_ROW_OFFSET": "CTL_ROW_OFFSET",
    "CTL_CTX_LEN": "CTL_CTX_LEN",
    "CTL_N_OUT": "CTL_N_OUT",
    "CTL_TOKEN": "CTL_TOKEN",
    "CTL_INTS": "CTL_INTS",
    "MODE_STORE": "PMODE_STORE",
    "MODE_ADD": "PMODE_ADD",
    "MODE_SWIGLU": "PMODE_SWIGLU",
    "MODE_QKV_ROPE": "PMODE_QKV_ROPE",
}

# `#define NAME 12` with an optional trailing comment; expressions and function-like macros don't match.
_INTEGER_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)[ \t]+(-?\d+)[ \t]*(?://.*|/\*.*)?$",
                             re.MULTILINE)


def parse_defines(text: str) -> dict[str, int]:
    """{NAME: value} of the `#define NAME <integer>` lines of C source text (a later line wins)."""
    return {name: int(value) for name, value in _INTEGER_DEFINE.findall(text)}


@functools.lru_cache(maxsize=None)
def header_values(header: Path | None = None) -> dict[str, int]:
    """{Python name: value} for every name of HEADER_NAMES, read from common.cuh (or `header`)."""
    header = header or kernel_dir() / HEADER
    defines = parse_defines(header.read_text())
    missing = sorted(c_name for c_name in HEADER_NAMES.values() if c_name not in defines)
    if missing:
        raise ValueError(f"{header} lacks `#define NAME <integer>` lines for {missing}")
    return {py_name: defines[c_name] for py_name, c_name in HEADER_NAMES.items()}


def reexport(module_name: str):
    """A module `__getattr__` that serves the header's names, for modules that re-export them."""
    def __getattr__(name: str) -> int:
        if name in HEADER_NAMES:
            return header_values()[name]
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
    return __getattr__


__getattr__ = reexport(__name__)
