"""The floating-point environment every rule assumes: IEEE 754 gradual underflow.

``torch.set_flush_denormal(True)`` (or a library built with fast-math) sets the calling thread's FTZ/DAZ
bits, under which numpy and BLAS flush subnormal results and operands to zero. Float evaluation then
departs from TorchLean's IEEE Float semantics, and the interval rules' underflow allowances (one smallest
normal per sum) no longer hold: a subnormal float32 weight reads as 0, so a box encloses another
network. The evaluator loop refuses to run in that mode instead of answering wrongly.
"""

from __future__ import annotations

__all__ = ["flushes_subnormals", "FLUSH_MESSAGE"]

# 2**-1022 * 0.5 is subnormal (0 under FTZ); 5e-324 * 1 reads a subnormal operand (0 under DAZ). Python
# floats run on the same SSE unit as numpy; names, not literals, so the products are not constant-folded
_NORMAL, _SUBNORMAL, _HALF, _ONE = 2.0 ** -1022, 5e-324, 0.5, 1.0

FLUSH_MESSAGE = ("this thread flushes subnormal numbers to zero (FTZ/DAZ, as torch.set_flush_denormal(True) "
                 "sets), which IEEE semantics and sound rounding bounds cannot allow; call "
                 "torch.set_flush_denormal(False) first")


def flushes_subnormals() -> bool:
    """Whether the calling thread's arithmetic flushes subnormal results or operands to zero."""
    return _NORMAL * _HALF == 0.0 or _SUBNORMAL * _ONE == 0.0
