"""Report types shared by binding, audit and differential testing.

A report is a list of findings. Each finding has a ``kind`` (a short machine-readable tag such as
``"missing"`` or ``"swap"``), a readable ``message``, and where it applies the node id and the external
tensor names (``keys``) it concerns. ``severity`` decides whether a finding makes the report fail:
``"error"`` does, ``"warning"`` and ``"info"`` are listed but leave ``.ok`` true (an ambiguity group is
information, a missing tensor is an error). Subclasses add fields (a diff report's
``first_divergence``, an audit report's ``swaps``) by overriding ``_extra_json``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

__all__ = ["Finding", "Report", "SEVERITIES", "jsonable"]

SEVERITIES = ("error", "warning", "info")


def jsonable(value: Any) -> Any:
    """``value`` with numpy arrays/scalars and tuples turned into plain JSON values."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, np.generic):
        return jsonable(value.item())
    if isinstance(value, float) and not np.isfinite(value):
        return repr(value)  # JSON has no NaN/Inf; keep them readable instead of invalid
    if isinstance(value, Finding):
        return value.to_json()
    return value


@dataclass(frozen=True)
class Finding:
    """One thing a check found: what (kind, message), where (node, keys), and raw figures (data)."""

    kind: str
    message: str
    node: int | None = None
    keys: tuple[str, ...] = ()
    data: dict | None = None
    severity: str = "error"

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {self.severity!r}")
        if not isinstance(self.keys, tuple):
            object.__setattr__(self, "keys", tuple(self.keys))

    def to_json(self) -> dict:
        out: dict[str, Any] = {"kind": self.kind, "severity": self.severity, "message": self.message}
        if self.node is not None:
            out["node"] = int(self.node)
        if self.keys:
            out["keys"] = list(self.keys)
        if self.data:
            out["data"] = jsonable(self.data)
        return out

    def __str__(self) -> str:
        return self.message


@dataclass
class Report:
    """Findings plus a title; ``ok`` is true when no finding has severity ``"error"``."""

    findings: list[Finding] = field(default_factory=list)
    title: str = "report"

    def __post_init__(self) -> None:
        self.findings = list(self.findings)

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    def of_kind(self, *kinds: str) -> list[Finding]:
        """The findings whose kind is one of ``kinds``, in report order."""
        return [f for f in self.findings if f.kind in kinds]

    def add(self, finding: Finding) -> Finding:
        self.findings.append(finding)
        return finding

    def extend(self, findings: Iterable[Finding]) -> None:
        self.findings.extend(findings)

    def _extra_json(self) -> dict:
        """Subclass hook: further top-level fields for ``to_json``."""
        return {}

    def to_json(self) -> dict:
        return {"title": self.title, "ok": self.ok, **jsonable(self._extra_json()),
                "findings": [f.to_json() for f in self.findings]}

    def __str__(self) -> str:
        errors = len(self.errors)
        status = "OK" if self.ok else f"FAILED ({errors} error{'s' if errors != 1 else ''})"
        lines = [f"{self.title}: {status}"]
        for f in sorted(self.findings, key=lambda f: SEVERITIES.index(f.severity)):  # errors first, stable
            lines.append(f"  [{f.severity}] {f.kind}: {f.message}")
        return "\n".join(lines)
