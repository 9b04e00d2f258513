"""Reduction operations: names, numpy kernels and which dtypes each accepts (MPI-4.0 section 6.9.2).

The 16-bit floats (numpy's float16, ml_dtypes' bfloat16: `HALF`) have no predefined MPI
datatype. They travel as 16-bit words (`wire`), and their SUM, AVG and PROD accumulate in
float32 (`ACCUMULATOR`): numpy's and ml_dtypes' kernels themselves compute each 16-bit
addition in float32 and round it, so a chain of 16-bit hops rounds once per hop, and a sum
kept in float32 rounds once at the end (`ringmpi.schedules.Algorithm.run`).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

__all__ = ["OPS", "op_name", "check_op_dtype", "SUPPORTED_DTYPES", "CANONICAL", "HALF", "BFLOAT16", "ACCUMULATOR",
           "kind", "canonical", "is_half", "wire", "ROUNDING", "convert"]

_INT = "iu"
#: numpy kernel of each predefined MPI operation.
OPS = {
    "SUM": np.add,
    "PROD": np.multiply,
    "MAX": np.maximum,
    "MIN": np.minimum,
    "LAND": np.logical_and,
    "LOR": np.logical_or,
    "LXOR": np.logical_xor,
    "BAND": np.bitwise_and,
    "BOR": np.bitwise_or,
    "BXOR": np.bitwise_xor,
    "AVG": np.add,  # NCCL's ncclAvg, torch's ReduceOp.AVG: summed, then divided by the rank count once
}
# dtype kinds (numpy `dtype.kind`) valid for each op, as the MPI standard lists them:
# SUM/PROD: integer, floating, complex; MAX/MIN: integer, floating;
# logical ops: integer and logical; bitwise ops: integer (and byte).
_VALID_KINDS = {
    "SUM": "iufc", "PROD": "iufc", "MAX": "iuf", "MIN": "iuf",
    "LAND": "iub", "LOR": "iub", "LXOR": "iub",
    "BAND": "iu", "BOR": "iu", "BXOR": "iu", "AVG": "fc",
}
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
#: the 16-bit floats; numpy sees bfloat16 as a void kind ('V'), `kind` calls it 'f'
HALF = (np.dtype(np.float16), BFLOAT16)
#: where the SUM, AVG and PROD of a 16-bit float accumulate
ACCUMULATOR = np.dtype(np.float32)
#: the ops whose 16-bit result rounds (MAX and MIN pick an input: exact in any width)
ROUNDING = ("SUM", "AVG", "PROD")
#: dtypes ringmpi takes: those with a predefined MPI datatype (numpy's longdouble has none
#: portable), and the 16-bit floats, which travel as 16-bit words
SUPPORTED_DTYPES = tuple(np.dtype(t) for t in (
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float32", "float64", "complex64", "complex128", "bool")) + HALF
#: (kind, itemsize) -> the one dtype ringmpi sends for it: numpy's equal-but-distinct dtypes
#: ('l' and 'q' on LP64) would otherwise reach MPI as different datatypes on different ranks
CANONICAL = {(d.kind, d.itemsize): d for d in SUPPORTED_DTYPES}
_WORD = np.dtype(np.uint16)


def op_name(op: object) -> str:
    """Normalise an op given as a name ("sum", "SUM") or an object with a predefined name.

    mpi4py's `MPI.SUM` is translated by the MPI transport (the only module that knows
    mpi4py, `Group.op_name`); here only names and objects carrying `ringmpi_name`.
    """
    if isinstance(op, str):
        name = op.upper()
    else:
        name = getattr(op, "ringmpi_name", None)
        if not isinstance(name, str):
            raise ValueError(f"unknown reduction op {op!r}; expected a name ({', '.join(OPS)}) "
                             "or one of MPI's predefined ops")
        name = name.upper()
    if name not in OPS:
        raise ValueError(f"unknown reduction op {op!r}; expected one of {', '.join(OPS)}")
    return name


def kind(dtype: np.dtype) -> str:
    """numpy's `dtype.kind`, but 'f' for bfloat16 (a floating type numpy files as void)."""
    return "f" if dtype == BFLOAT16 else dtype.kind


def is_half(dtype: np.dtype) -> bool:
    """A 16-bit float: float16 or bfloat16."""
    return dtype.itemsize == 2 and kind(dtype) == "f"


def canonical(dtype: np.dtype) -> np.dtype | None:
    """The one dtype ringmpi sends for `dtype` (`CANONICAL`), or None for one it does not take."""
    if dtype.kind == "V":
        return BFLOAT16 if dtype == BFLOAT16 else None
    return CANONICAL.get((dtype.kind, dtype.itemsize))


def wire(buf: np.ndarray) -> np.ndarray:
    """`buf` as MPI may be handed it: a 16-bit float as 16-bit words (MPI has no bfloat16,
    and float16 only as an extension), what every other dtype is as it is."""
    return buf.view(_WORD) if buf.dtype.itemsize == 2 and buf.dtype.kind in "fV" else buf


def check_op_dtype(op: str, dtype: np.dtype) -> str | None:
    """Return why `op` is invalid for `dtype`, or None when it is valid."""
    if kind(dtype) not in _VALID_KINDS[op]:
        return f"op {op} is not defined for dtype {dtype} (MPI allows it on kinds {_VALID_KINDS[op]!r})"
    return None


# -- float16 conversions at numpy's speed on every value ------------------------------------
#: float16's smallest normal number: below it numpy's float32 -> float16 conversion sets
#: the underflow flag element by element, many times slower (gradients of a learned model
#: are mostly there; benchmarks/README.md, "Why fp16 cost 2.7-3x float32's")
_HALF_TINY = 2.0 ** -14
#: float16's subnormals are the multiples of 2**-24
_HALF_STEP = 2.0 ** 24
#: every float16 bit pattern's float32 value (widening by lookup: numpy's own conversion
#: slows down on subnormals too, the lookup does not)
_WIDE = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
_PIECE = 1 << 16


def convert(src: np.ndarray, dst: np.ndarray) -> None:
    """dst = src between a float and float16 (or any dtypes, through numpy), with numpy's
    own rounding (to nearest even) and bits. A value below float16's normal range is first
    rounded in src's own dtype to the float16 subnormal it becomes (rint(x 2**24) 2**-24,
    exact), so numpy's conversion finds nothing to flag."""
    if dst.dtype == np.float16 and src.dtype.kind == "f" and src.dtype.itemsize >= 4 and src.ndim == dst.ndim == 1:
        _narrow(src, dst)
    elif src.dtype == np.float16 and dst.dtype == np.float32 and src.ndim == dst.ndim == 1 and src.flags.c_contiguous:
        _widen(src, dst)
    else:
        np.copyto(dst, src, casting="unsafe")


def _widen(src: np.ndarray, dst: np.ndarray) -> None:
    """By lookup, a cache-sized piece at a time (indices and results stay in cache beside
    the table), without take's bounds checks (`clip`: a 16-bit index is always in the
    table): half the time of one lookup of the whole array, and less than numpy's own
    conversion (benchmarks/README.md, "fp16 on the wire")."""
    bits = src.view(np.uint16)
    for lo in range(0, src.size, _PIECE):
        np.take(_WIDE, bits[lo:lo + _PIECE], out=dst[lo:lo + _PIECE], mode="clip")


def _narrow(src: np.ndarray, dst: np.ndarray) -> None:
    """A cache-sized piece at a time: the magnitudes, then (only where a 64th of a piece or
    more is below float16's normal range) those values rounded to its subnormal grid first:
    the rounding passes cost about as much as numpy's slow conversion of that share."""
    tiny, step = src.dtype.type(_HALF_TINY), src.dtype.type(_HALF_STEP)
    work, small = np.empty(min(src.size, _PIECE), src.dtype), np.empty(min(src.size, _PIECE), bool)
    for lo in range(0, src.size, _PIECE):
        s, d = src[lo:lo + _PIECE], dst[lo:lo + _PIECE]
        t, m = work[:s.size], small[:s.size]
        np.abs(s, out=t)
        np.less(t, tiny, out=m)            # (NaN is not small: it converts as it is)
        if np.count_nonzero(m) > s.size // 64:   # (numpy converts a few slowly: less than our passes cost)
            np.multiply(s, step, out=t)
            np.rint(t, out=t)
            np.divide(t, step, out=t)
            np.copyto(t, s, where=~m)
            s = t
        np.copyto(d, s, casting="unsafe")
