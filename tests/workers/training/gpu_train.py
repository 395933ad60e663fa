"""Worker: train a small MLP for a few steps on the backend chosen by MINIDIST_DEVICE; save parameters.

argv: out.npz. Run once with MINIDIST_DEVICE=cpu and once with MINIDIST_DEVICE=cuda by
tests/backend/test_gpu.py.
"""

import sys

import numpy as np

import minidist as md
from minidist import backend, nn, optim

md.manual_seed(0)
rng = np.random.default_rng(0)
x, y = rng.standard_normal((32, 8)), rng.integers(0, 3, 32)
model = nn.Sequential(nn.Linear(8, 16, dtype=np.float64), nn.GELU(), nn.Linear(16, 3, dtype=np.float64))
opt = optim.AdamW(model.parameters(), lr=0.01)
for _ in range(5):
    loss = nn.functional.cross_entropy(model(md.tensor(x, dtype=np.float64)), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
assert backend.device().startswith("cuda") == (backend.xp().__name__ == "cupy")
np.savez(
    sys.argv[1], device=backend.device(), **{k: backend.to_numpy(v) for k, v in model.state_dict().items()}
)
