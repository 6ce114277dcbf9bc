import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

FIXTURES = ROOT / "fixtures"


@pytest.fixture(autouse=True)
def _seeded_global_randomness():
    """Every test starts from the same global RNG states (torch.randn in model builders, legacy
    np.random), whatever ran before it: a failure reproduces alone and in the whole suite."""
    np.random.seed(0)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(0)
    yield
