"""The HTML report of ``diff --report`` / ``show --html`` / ``bounds --report``: its data and, in a real
headless Chromium (Debian's ``chromium`` driven by playwright, no browser download), that the graph renders
with one element per IR node, the first divergence is marked, and clicking a node shows its details."""

import json
import re
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torchlean_bridge as tlb  # noqa: E402
from torchlean_bridge.app.cli import main  # noqa: E402
from torchlean_bridge.app.commands.common import load_factory  # noqa: E402
from torchlean_bridge.app.html_report import embed, layers  # noqa: E402
from torchlean_bridge.bundle import Bundle  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

ARTIFACTS = ROOT / "tests" / "artifacts"  # gitignored; CI keeps the screenshot

CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync"]

REFERENCE = '''
import torch
from torch import nn


class CNN(nn.Module):
    """conv -> relu -> conv -> (+ skip) -> relu -> pool -> flatten -> linear: a DAG with a branch."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(2, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 3 * 3, 5)

    def forward(self, x):
        h = torch.relu(self.conv1(x))
        h = torch.relu(self.conv2(h) + h)
        h = torch.nn.functional.max_pool2d(h, 2)
        return self.fc(torch.flatten(h, 1))


def make():
    torch.manual_seed(0)
    return CNN().eval()
'''


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    """The CNN's reference file, its good bundle and a bundle with conv2.weight perturbed, saved."""
    tmp = tmp_path_factory.mktemp("cnn")
    (tmp / "ref.py").write_text(REFERENCE)
    ref = f"{tmp / 'ref.py'}:make"
    m = load_factory(ref, "--reference")
    bundle = tlb.import_fx(m, (torch.randn(1, 2, 6, 6),))
    (b,) = bundle.roles.uses("conv2.weight")
    p = bundle.payload.copy()
    p.set(b.node, b.role, p.get(b.node, b.role) * 1.05)
    tlb.save(bundle, tmp / "good")
    tlb.save(Bundle(bundle.graph, p, bundle.roles, bundle.report), tmp / "bad")
    return tmp, ref, bundle, b.node


def _data(html: str) -> dict:
    m = re.search(r'<script type="application/json" id="tlb-data">(.*?)</script>', html, re.S)
    assert m, "no embedded data block"
    return json.loads(m.group(1))


def test_layers_are_longest_paths_from_an_input(cnn):
    _, _, bundle, _ = cnn
    g = bundle.graph
    lay = layers(g)
    for n in g.nodes:
        assert lay[n.id] == (1 + max(lay[p] for p in n.parents) if n.parents else 0)
        assert all(lay[p] < lay[n.id] for p in n.parents)


def test_embedded_json_cannot_close_its_script_block():
    text = embed({"name": "</script><script>alert(1)</script>", "x": float("inf"), "y": "a&b<!--"})
    assert "</" not in text and "<!--" not in text
    assert json.loads(text) == {"name": "</script><script>alert(1)</script>", "x": "inf", "y": "a&b<!--"}


def test_diff_report_data_marks_the_first_divergence(cnn, tmp_path, capsys):
    tmp, ref, bundle, bad_node = cnn
    out = tmp_path / "r.html"
    assert main(["diff", str(tmp / "bad"), "--reference", ref, "--random", "2", "--report", str(out)]) == 1
    assert f"wrote {out}" in capsys.readouterr().out
    data = _data(out.read_text())
    assert [n["id"] for n in data["graph"]["nodes"]] == [n.id for n in bundle.graph.nodes]
    ov = data["overlay"]
    assert ov["kind"] == "diff" and ov["first_divergence"]["node"] == bad_node
    row = ov["rows"][str(bad_node)]
    assert row["status"] == "diverged" and row["ratio"] > 1 and row["max_abs"] > row["budget"]
    conv2 = next(n for n in data["graph"]["nodes"] if n["id"] == bad_node)
    assert {p["key"] for p in conv2["params"]} == {"conv2.weight", "conv2.bias"}
    assert conv2["source"].get("location", "").startswith(str(tmp / "ref.py"))  # provenance file:line


def test_exchanged_biases_mark_both_nodes_as_suspected(cnn, tmp_path):
    tmp, ref, bundle, _ = cnn
    (b1,), (b2,) = bundle.roles.uses("conv1.bias"), bundle.roles.uses("conv2.bias")
    p = bundle.payload.copy()
    p.set(b1.node, b1.role, bundle.payload.get(b2.node, b2.role))
    p.set(b2.node, b2.role, bundle.payload.get(b1.node, b1.role))
    tlb.save(Bundle(bundle.graph, p, bundle.roles, bundle.report), tmp_path / "swapped")
    out = tmp_path / "r.html"
    assert main(["diff", str(tmp_path / "swapped"), "--reference", ref, "--random", "1", "--quiet",
                 "--report", str(out)]) == 1
    ov = _data(out.read_text())["overlay"]
    assert ov["first_divergence"]["node"] == b1.node
    assert {int(k) for k in ov["suspected"]} == {b1.node, b2.node}
    assert set(ov["suspected"][str(b1.node)]) >= {"conv1.bias"}


def test_report_and_html_targets_are_checked_before_any_work(cnn, tmp_path, capsys):
    tmp, ref, _, _ = cnn
    assert main(["diff", str(tmp / "good"), "--reference", ref, "--report", str(tmp_path / "r.png")]) == 2
    assert "--report" in capsys.readouterr().err
    assert main(["show", str(tmp / "good"), "--html", str(tmp_path)]) == 2
    assert not list(tmp_path.iterdir())


def test_show_html_and_bounds_report(cnn, tmp_path):
    tmp, _, bundle, _ = cnn
    assert main(["show", str(tmp / "good"), "--html", str(tmp_path / "g.html")]) == 0
    data = _data((tmp_path / "g.html").read_text())
    assert data["overlay"] is None and len(data["graph"]["nodes"]) == len(bundle.graph)
    np.save(tmp_path / "c.npy", np.zeros((1, 2, 6, 6)))
    assert main(["bounds", str(tmp / "good"), "--center", str(tmp_path / "c.npy"), "--radius", "0.1",
                 "--samples", "5", "--report", str(tmp_path / "b.html"), "--quiet"]) == 0
    ov = _data((tmp_path / "b.html").read_text())["overlay"]
    assert ov["kind"] == "bounds" and len(ov["rows"]) == len(bundle.graph)
    x = bundle.graph.inputs[0]
    assert ov["rows"][str(x)]["width"] == pytest.approx(0.2, rel=1e-6)  # the input box: 2 x radius


def _browser():
    exe = shutil.which("chromium")
    if exe is None:
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("python playwright is not installed (pip install playwright==1.65.2)")
    return exe, sync_playwright


def _scale(page) -> float:
    return float(re.search(r"scale\(([^)]+)\)", page.locator("#viewport").get_attribute("transform"))[1])


def test_report_renders_and_clicking_the_divergent_node_shows_its_details(cnn, tmp_path):
    exe, sync_playwright = _browser()
    tmp, ref, bundle, bad_node = cnn
    out = tmp_path / "report.html"
    assert main(["diff", str(tmp / "bad"), "--reference", ref, "--random", "2", "--report", str(out),
                 "--quiet"]) == 1
    row = _data(out.read_text())["overlay"]["rows"][str(bad_node)]
    requests = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 800})
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(out.as_uri())
            page.wait_for_selector("body[data-ready='1']", timeout=10_000)
            assert not errors, errors
            assert page.locator("svg#canvas g.node").count() == len(bundle.graph)
            assert "parameter-mismatch: " in page.locator("#summary").inner_text()  # findings listed
            edges = sum(len(n.parents) for n in bundle.graph.nodes)
            assert page.locator("svg#canvas path.edge").count() == edges
            first = page.locator("svg#canvas g.node.first-divergence")
            assert first.count() == 1 and first.get_attribute("data-id") == str(bad_node)
            assert "diverged" in first.get_attribute("class").split()
            assert first.locator("rect.box").get_attribute("fill") == "#e4572e"
            suspected = _data(out.read_text())["overlay"]["suspected"]
            assert suspected == {str(bad_node): ["conv2.weight"]}
            assert [e.get_attribute("data-id") for e in page.locator("g.node.suspected").all()] == [str(bad_node)]
            first.click()
            assert page.locator("#details-title").inner_text() == f"node {bad_node}: conv"
            details = page.locator("#details-table").inner_text()
            assert "error (max abs)" in details and "budget" in details and "conv2.weight" in details
            shown = float(re.search(r"error \(max abs\)\s+(\S+)", details).group(1))
            assert shown == pytest.approx(row["max_abs"], rel=1e-3)
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "html_report.png"), full_page=True)
            before = _scale(page)
            box = first.bounding_box()
            page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            page.mouse.wheel(0, -300)  # zoom in around the node: it stays under the cursor
            assert _scale(page) > before
            after = first.bounding_box()
            assert after["width"] > box["width"]
            assert abs(after["x"] + after["width"] / 2 - (box["x"] + box["width"] / 2)) < 2

            # bounds --report: colored by box width, the input's box shown on click
            np.save(tmp_path / "c.npy", np.zeros((1, 2, 6, 6)))
            assert main(["bounds", str(tmp / "good"), "--center", str(tmp_path / "c.npy"), "--radius", "0.1",
                         "--samples", "0", "--report", str(tmp_path / "b.html"), "--quiet"]) == 0
            page.goto((tmp_path / "b.html").as_uri())
            page.wait_for_selector("body[data-ready='1']", timeout=10_000)
            assert not errors, errors
            nodes = page.locator("svg#canvas g.node.width")
            assert nodes.count() == len(bundle.graph)
            assert len({nodes.nth(i).locator("rect.box").get_attribute("fill") for i in range(nodes.count())}) > 2
            page.locator(f"svg#canvas g.node[data-id='{bundle.graph.inputs[0]}']").click()
            width = re.search(r"box width \(max\)\s+(\S+)", page.locator("#details-table").inner_text())[1]
            assert float(width) == pytest.approx(0.2, rel=1e-3)
        finally:
            browser.close()
    assert all(u.startswith("file://") for u in requests), requests  # no network
    assert (ARTIFACTS / "html_report.png").stat().st_size > 0
