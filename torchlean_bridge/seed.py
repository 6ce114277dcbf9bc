"""The seed chapters' models, built in code: the six-node MLP and the swapped-bias pair.

These are the embedded defaults the demo runs on and the fixtures the tests compare with the
chapters' printed outputs.
"""

from __future__ import annotations

import numpy as np

from .bundle import Bundle
from .graph import Graph, Node
from .payload import Payload
from .roles import Binding, RoleMap

__all__ = ["seed_mlp_graph", "seed_mlp_payload", "seed_mlp_bundle", "SEED_X0", "SEED_WEIGHTS",
           "bias_pair_bundle", "BIAS_PAIR"]

SEED_WEIGHTS = {
    "l1.weight": np.array([[.15, -.12, .08, .05], [.02, .11, -.09, .07], [-.04, .06, .10, -.03],
                           [.09, .01, .04, .13], [-.07, .03, .12, -.02]]),
    "l1.bias": np.array([.01, -.02, .03, 0., .02]),
    "l2.weight": np.array([[.05, .08, -.06, .03, .07], [-.04, .02, .09, -.01, .06],
                           [.10, -.03, .04, .05, -.08]]),
    "l2.bias": np.array([.02, -.01, 0.]),
}
SEED_X0 = np.array([0.3, -0.2, 0.1, 0.4])

# ReLU(x + b1) + b2 with identity weights: the architecture chapter's swapped-bias example
BIAS_PAIR = {
    "0.weight": np.eye(3), "0.bias": np.array([-1.0, 0.0, 0.0]),
    "2.weight": np.eye(3), "2.bias": np.array([1.0, 0.0, 0.0]),
}


def seed_mlp_graph() -> Graph:
    """tanh(sum(W2 relu(W1 x + b1) + b2)), x in R^4: the six-node listing of the chapter."""
    return Graph([
        Node(0, [], "input", [4]),
        Node(1, [0], "linear", [5]),
        Node(2, [1], "relu", [5]),
        Node(3, [2], "linear", [3]),
        Node(4, [3], "sum", []),
        Node(5, [4], "tanh", []),
    ], inputs=[0], outputs=[5])


def seed_mlp_payload() -> Payload:
    return Payload({1: {"weight": SEED_WEIGHTS["l1.weight"], "bias": SEED_WEIGHTS["l1.bias"]},
                    3: {"weight": SEED_WEIGHTS["l2.weight"], "bias": SEED_WEIGHTS["l2.bias"]}})


def seed_mlp_bundle() -> Bundle:
    roles = RoleMap([Binding("l1.weight", 1, "weight"), Binding("l1.bias", 1, "bias"),
                     Binding("l2.weight", 3, "weight"), Binding("l2.bias", 3, "bias")])
    return Bundle(seed_mlp_graph(), seed_mlp_payload(), roles, {"framework": "builder", "model": "seed MLP"})


def bias_pair_bundle() -> Bundle:
    """nn.Sequential(Linear(3, 3), ReLU(), Linear(3, 3)) as IR, with its state_dict keys bound."""
    g = Graph([Node(0, [], "input", [3]), Node(1, [0], "linear", [3]), Node(2, [1], "relu", [3]),
               Node(3, [2], "linear", [3])], inputs=[0], outputs=[3])
    payload = Payload({1: {"weight": BIAS_PAIR["0.weight"], "bias": BIAS_PAIR["0.bias"]},
                       3: {"weight": BIAS_PAIR["2.weight"], "bias": BIAS_PAIR["2.bias"]}})
    roles = RoleMap([Binding("0.weight", 1, "weight"), Binding("0.bias", 1, "bias"),
                     Binding("2.weight", 3, "weight"), Binding("2.bias", 3, "bias")])
    return Bundle(g, payload, roles, {"framework": "builder", "model": "bias pair"})
