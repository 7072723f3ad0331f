"""Refuse a non-finite update so the weights stay intact: guard_model (Model) and GuardedTrainStep (own loop).

    python protect_weights.py

A batch with an Inf arrives at step 5: the update is refused, the weights stay finite, training goes on.
Used by docs/how-to/protect-weights.md; tests/test_docs.py runs it.
"""
import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn
from mindspore.train import Model

import mindguard

ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
mindguard.fix_randomness(seed=1)


def batches(poison_step=5):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 8)).astype(np.float32)
    y = x.sum(axis=1, keepdims=True)
    x[(poison_step - 1) * 4, 0] = np.inf       # one broken record in batch `poison_step` (batch size 4)
    return ds.NumpySlicesDataset({"data": x, "label": y}, shuffle=False).batch(4)


def build_network():
    return nn.SequentialCell(nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 1))


# [start:guard_model]
net = build_network()
model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.01))
model = mindguard.guard_model(model, max_skips=3)      # tolerate up to 3 refused steps in a row
model.train(1, batches(), callbacks=[mindguard.Guard()])
# [end:guard_model]
print(f"Model: all parameters finite: {all(np.isfinite(p.asnumpy()).all() for p in net.trainable_params())}")

# [start:own_loop]
net = build_network()
optimizer = nn.SGD(net.trainable_params(), learning_rate=0.01)
train_step = mindguard.GuardedTrainStep(nn.WithLossCell(net, nn.MSELoss()), optimizer, max_skips=3)
for step, (data, label) in enumerate(batches().create_tuple_iterator(num_epochs=1), start=1):
    loss, refused = train_step(data, label)
    if refused:
        print(f"step {step}: update refused; weights kept")
# [end:own_loop]
finite = all(np.isfinite(p.asnumpy()).all() for p in net.trainable_params())
print(f"own loop: all parameters finite: {finite}")
assert finite
