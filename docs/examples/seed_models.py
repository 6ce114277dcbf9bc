"""Zero-argument factories for the CLI guide (docs/cli.md): the seed chapters' two models.

    torchlean-bridge import docs/examples/seed_models.py:seed_mlp --input-shape 4 -o seed
"""

from torchlean_bridge.app.commands.demo import bias_pair_module as bias_pair  # noqa: F401
from torchlean_bridge.app.commands.demo import seed_module as seed_mlp  # noqa: F401
