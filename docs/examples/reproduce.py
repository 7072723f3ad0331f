"""Make a run repeat: fix_randomness, and save_params / load_params.

    python reproduce.py

Used by docs/how-to/reproduce.md; tests/test_docs.py runs it.
"""
import tempfile

import numpy as np

import mindspore as ms
from mindspore import nn

import mindguard
from mindguard.training.reproduce import load_params, save_params

ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")

# [start:seed]
settings = mindguard.fix_randomness(1, cpu_single_thread=True)   # first thing: before building the network
# [end:seed]
print(f"fix_randomness set: {sorted(settings)}")

# [start:params]
net = nn.SequentialCell(nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 1))
directory = tempfile.mkdtemp() + "/init_params"
save_params(net, directory)                  # one .npy per parameter + a checksummed manifest.json
other = nn.SequentialCell(nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 1))
loaded = load_params(other, directory)       # strict: names every missing, extra or mis-shaped parameter
# [end:params]
same = all(np.array_equal(a.asnumpy(), b.asnumpy()) for a, b in zip(net.get_parameters(), other.get_parameters()))
print(f"loaded {len(loaded)} parameters; identical: {same}")
assert same and len(loaded) == 4
