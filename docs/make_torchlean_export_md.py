"""Regenerate the tables of docs/torchlean-export.md from passes/v1_forms.py: python docs/make_torchlean_export_md.py"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from torchlean_bridge.passes.v1_forms import APPROXIMATIONS, V1_FORMS  # noqa: E402


def tables() -> dict[str, str]:
    forms = ["| kind | v1 form | deviation class |", "|---|---|---|"]
    forms += [f"| `{k}` | {f.formula} | {f.deviation} |" for k, f in sorted(V1_FORMS.items())]
    approx = ["| option | v1 form |", "|---|---|"]
    approx += [f"| `--approximate {k}={n}` | {formula} |" for (k, n), (_, formula) in APPROXIMATIONS.items()]
    return {"forms": "\n".join(forms), "approximations": "\n".join(approx)}


def render(text: str) -> str:
    for name, table in tables().items():
        text = re.sub(rf"(<!-- {name}:start[^\n]*-->\n).*?(<!-- {name}:end -->)",
                      lambda m: m.group(1) + table + "\n" + m.group(2), text, flags=re.S)
    return text


if __name__ == "__main__":
    path = ROOT / "docs" / "torchlean-export.md"
    path.write_text(render(path.read_text()))
