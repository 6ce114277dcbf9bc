"""The linear-bound domain (CROWN): backward linear relaxation, sound in floating point."""

from .crown import METHODS, Crown, LinearBounds, linear_bounds

__all__ = ["linear_bounds", "LinearBounds", "Crown", "METHODS"]
