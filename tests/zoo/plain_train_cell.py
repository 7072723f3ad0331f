"""A PyNative training whose train step is a plain nn.Cell holding `net_with_loss` (no `.network`, not a
TrainOneStepCell subclass) -- model-zoo code often writes its step this way. Batch 4 (global step 4) carries a
sample scaled by 1000: log(softmax) underflows to log(0) = -inf on the marked line."""
import numpy as np
import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn, ops
from mindspore.train import Model, LossMonitor
import mindguard

mindguard.fix_randomness(3)
ms.set_context(mode=ms.PYNATIVE_MODE)

class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(8, 4)
    def construct(self, x):
        h = self.fc(x)
        return ops.log(ops.softmax(h, axis=-1))[:, :1]  # CULPRIT

class TrainStep(nn.Cell):
    def __init__(self, net_with_loss, optimizer):
        super().__init__(auto_prefix=False)
        self.net_with_loss = net_with_loss
        self.optimizer = optimizer
        self.weights = optimizer.parameters
        self.grad = ops.GradOperation(get_by_list=True)
    def construct(self, x, y):
        loss = self.net_with_loss(x, y)
        grads = self.grad(self.net_with_loss, self.weights)(x, y)
        self.optimizer(grads)
        return loss

def gen():
    rng = np.random.RandomState(0)
    for i in range(24):
        x = rng.randn(8).astype(np.float32)
        if i == 13:
            x *= 1000
        yield x, np.ones(1, np.float32)

net = Net()
with_loss = nn.WithLossCell(net, nn.MSELoss())
opt = nn.SGD(net.trainable_params(), 0.01)
data = ds.GeneratorDataset(gen, ["x", "y"], shuffle=False).batch(4)
Model(TrainStep(with_loss, opt)).train(2, data, callbacks=[mindguard.Guard(), LossMonitor(1)])
