import signal
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


def ctrl_c_reaches_it() -> None:
    """``preexec_fn`` of a CLI process a test interrupts: SIGINT back to its default action. A suite started
    as a background job of a non-interactive shell (``cmd &``) inherits SIGINT ignored, Python then installs
    no KeyboardInterrupt handler, and the test's Ctrl-C would never arrive."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
