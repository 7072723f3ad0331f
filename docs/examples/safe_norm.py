"""The fix for nn.Norm / ops.norm of an all-zero vector: mindguard.SafeNorm, safe_norm, make_safe.

    python safe_norm.py

Used by docs/how-to/fix-nn-norm.md; tests/test_docs.py runs it.
"""
import numpy as np

import mindspore as ms
from mindspore import nn

import mindguard

ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")


class EmbedNormNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(10, 4, padding_idx=0)   # row 0 is the zero vector
        # [start:cell]
        self.norm = mindguard.SafeNorm(axis=-1)   # was: nn.Norm(axis=-1)
        # [end:cell]

    def construct(self, tokens):
        return self.norm(self.embedding(tokens))


# [start:make_safe]
net = nn.SequentialCell(nn.Embedding(10, 4, padding_idx=0), nn.Norm(axis=-1))
replaced = mindguard.make_safe(net)       # swaps every nn.Norm for SafeNorm, in place, before training
print(f"replaced: {replaced}")
# [end:make_safe]

# [start:function]
x = ms.Tensor(np.zeros((2, 3), np.float32))
grad = ms.grad(lambda t: mindguard.safe_norm(t, axis=1).sum())(x)   # was: ops.norm(t, dim=1)
print(f"gradient at the zero vector: {grad.asnumpy().tolist()}")
# [end:function]
assert np.isfinite(grad.asnumpy()).all()
assert replaced and np.isfinite(EmbedNormNet()(ms.Tensor([[0, 1]], ms.int32)).asnumpy()).all()
