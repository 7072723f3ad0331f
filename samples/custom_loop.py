"""A custom training loop (no ``Model``) protected by ``mindguard.GuardedTrainStep``.

``GuardedTrainStep`` is a drop-in for ``nn.TrainOneStepCell``: it checks the gradients inside the
compiled step and refuses a non-finite update, so the weights stay intact and the loop knows the
exact step. Here the padded batch of the field report's model arrives at step 5: the step is
refused, the weights stay finite, training goes on.

    python samples/custom_loop.py
"""
import numpy as np

import mindspore as ms
from mindspore import nn

import mindguard
from mindguard.demos.norm_nan import build_network, make_dataset

ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
mindguard.fix_randomness(1)
net = build_network()
optimizer = nn.SGD(net.trainable_params(), learning_rate=0.05)
train_step = mindguard.GuardedTrainStep(nn.WithLossCell(net, nn.MSELoss()), optimizer, max_skips=3)

for step, (tokens, label) in enumerate(make_dataset(8, poison_step=5).create_tuple_iterator(num_epochs=1), start=1):
    loss, refused = train_step(tokens, label)
    if refused:
        print(f"step {step}: update refused (loss {float(loss.asnumpy()):.4f}); weights kept")
    else:
        print(f"step {step}: loss {float(loss.asnumpy()):.4f}")

finite = all(np.isfinite(p.asnumpy()).all() for p in net.trainable_params())
print(f"all parameters finite: {finite}")
