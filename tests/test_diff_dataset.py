"""``diff --inputs``: a whole dataset, one set at a time; each node says on how many sets it exceeded
its budget and where it was worst, so a divergence only a few inputs trigger is found."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import torchlean_bridge as tlb  # noqa: E402
from torchlean_bridge.app.diff_dataset import load_dataset  # noqa: E402
from tests.test_diff import with_node  # noqa: E402

RARE = [17, 230, 231, 498, 640, 777, 999]  # the input sets large enough to reach the clamp


class ClampCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = nn.Conv2d(1, 4, 3), nn.Linear(64, 3)

    def forward(self, x):
        return self.fc(torch.flatten(torch.clamp(self.conv(x), -1.5, 1.5), 1))


@pytest.fixture(scope="module")
def cnn():
    torch.manual_seed(0)
    m = ClampCNN().eval()
    bundle = tlb.import_fx(m, (torch.zeros(1, 1, 6, 6),))
    clamp = next(n.id for n in bundle.graph.nodes if n.kind == "clamp")
    return m, bundle, with_node(bundle, clamp, max=1.6), clamp  # the slip only large activations show


def dataset(n: int) -> np.ndarray:
    rng = np.random.default_rng(1)
    x = rng.uniform(-0.2, 0.2, (n, 1, 1, 6, 6))  # conv outputs stay inside (-1.5, 1.5)
    x[[k for k in RARE if k < n]] *= 30.0
    return x


@pytest.mark.slow
def test_a_thousand_inputs_find_the_divergence_only_a_few_trigger(cnn, tmp_path):
    m, good, bad, clamp = cnn
    np.savez(tmp_path / "data.npz", x=dataset(1000))
    report = tlb.diff(bad, against="torch", module=m, dataset=tmp_path / "data.npz")
    assert len(report.inputs) == 1000
    assert report.first_divergence.node == clamp
    row = next(r for r in report.nodes if r.node == clamp)
    assert row.exceeded == len(RARE) and row.worst_on in {f"data.npz[{k}]" for k in RARE}
    assert row.diverged_on == f"data.npz[{RARE[0]}]"
    assert f"exceeded on {len(RARE)} of 1000 input sets" in report.first_divergence.message
    # the same thousand through the correct bundle: no node exceeds anywhere
    ok = tlb.diff(good, against="torch", module=m, dataset=tmp_path / "data.npz")
    assert ok.ok and all(r.exceeded == 0 for r in ok.nodes + ok.outputs), str(ok)


def test_a_folder_of_samples_and_the_cli(cnn, tmp_path, capsys):
    from torchlean_bridge.app.cli import main
    m, good, bad, clamp = cnn
    folder = tmp_path / "samples"
    folder.mkdir()
    for k, x in enumerate(dataset(40)):
        np.save(folder / f"{k:03d}.npy", x)
    d = load_dataset(bad.graph, folder)
    assert len(d) == 40 and d[17][0] == "samples[17]" and np.array_equal(d[17][1][0], dataset(40)[17])
    report = tlb.diff(bad, against="torch", module=m, dataset=d)
    assert report.first_divergence.node == clamp
    assert next(r for r in report.nodes if r.node == clamp).exceeded == 1  # only set 17 of the first 40
    tlb.save(bad, tmp_path / "bad")
    (tmp_path / "m.py").write_text(
        "import torch\nfrom tests.test_diff_dataset import ClampCNN\n"
        "def make():\n    torch.manual_seed(0)\n    return ClampCNN().eval()\n")
    rc = main(["diff", str(tmp_path / "bad"), "--reference", f"{tmp_path / 'm.py'}:make", "--inputs", str(folder),
               "--json", str(tmp_path / "r.json"), "--quiet"])
    assert rc == 1
    out = capsys.readouterr().out
    assert "exceeded on 1 of 40 input sets, worst on samples[17]" in out
    rows = json.loads((tmp_path / "r.json").read_text())["nodes"]
    assert next(r for r in rows if r["node"] == clamp)["exceeded"] == 1


@pytest.mark.parametrize("arrays,message", [
    ({"x": np.zeros((5, 1, 1, 6, 5))}, "has shape [5, 1, 1, 6, 5], expected [1, 1, 6, 6] or [N, 1, 1, 6, 6]"),
    ({"x": np.zeros((5, 1, 1, 6, 6), np.int64) > 0}, "has element type bool, expected float"),
    ({"a": np.zeros((2, 1, 1, 6, 6)), "b": np.zeros((2, 1, 1, 6, 6))}, "name the arrays after them"),
])
def test_a_malformed_dataset_is_refused_naming_it(cnn, tmp_path, arrays, message):
    np.savez(tmp_path / "d.npz", **arrays)
    with pytest.raises(tlb.BridgeError, match="--inputs .*d.npz") as e:
        load_dataset(cnn[1].graph, tmp_path / "d.npz")
    assert message in str(e.value)


def test_a_file_that_is_not_a_dataset_is_refused(cnn, tmp_path):
    (tmp_path / "d.npz").write_bytes(b"not a zip")
    with pytest.raises(tlb.BridgeError, match="cannot read input archive"):
        load_dataset(cnn[1].graph, tmp_path / "d.npz")
    with pytest.raises(tlb.BridgeError, match="expected an .npz file or a folder"):
        load_dataset(cnn[1].graph, tmp_path / "missing.npy")
