"""Rule tables keyed by op kind: the one decorator both semantic domains register with."""

from __future__ import annotations

from typing import Callable, MutableMapping, TypeVar

__all__ = ["registrar"]

F = TypeVar("F", bound=Callable)


def registrar(table: MutableMapping[str, F]) -> Callable[..., Callable[[F], F]]:
    """``rule = registrar(TABLE)``; then ``@rule("relu", "tanh")`` files the function under each kind."""
    def rule(*kinds: str) -> Callable[[F], F]:
        def register(fn: F) -> F:
            for k in kinds:
                table[k] = fn
            return fn
        return register
    return rule
