"""A realistically sized training that goes NaN at a known step (used by ``benchmarks/run.py`` in subprocesses).

MLP 784-H-H-10 (H=1024: ~1.86M parameters) that normalises each input row, ``x / nn.Norm(x)``; the batch
of ``--poison`` (1-based global step) holds one blank (all-zero) row, so that step's forward computes
0/0 = NaN. GRAPH mode, CPU, Momentum, fixed seed. ``--model resnet18``: a ResNet-18 whose stem overflows at
``--poison``; ``--train-step ema_clip`` trains it through a mindcv-style step (clip by global norm, EMA of the weights).

    python benchmarks/failing_train.py --guard                 # mindguard.Guard (hunt-ready), stops at the failure
    python benchmarks/failing_train.py --dump-iteration 19 --dump-path /abs/dir   # DumpOnDemand
    python benchmarks/failing_train.py --dump-all /abs/dir     # DumpConfig(iteration="all"), every step
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def ema_clip_train_step(network_with_loss, optimizer):
    """A mindcv-style train step: gradients clipped by global norm (1.0), an EMA (0.999) of the trained weights."""
    from mindspore import nn, ops

    ema_update = ops.MultitypeFuncGraph("ema_update")

    @ema_update.register("Tensor", "Tensor", "Tensor")
    def _update(factor, ema_weight, weight):
        return ops.assign(ema_weight, ema_weight * factor + weight * (1 - factor))

    class EmaClipTrainStep(nn.TrainOneStepCell):
        def __init__(self, network, opt):
            super().__init__(network, opt)
            self.ema_weight = self.weights.clone("ema", init="same")
            self.decay = ms.Tensor(0.999, ms.float32)
            self.hyper_map = ops.HyperMap()

        def construct(self, *inputs):
            loss = self.network(*inputs)
            grads = self.grad(self.network, self.weights)(*inputs, ops.ones_like(loss))
            grads = ops.clip_by_global_norm(grads, clip_norm=1.0)
            loss = ops.depend(loss, self.optimizer(grads))
            return ops.depend(loss, self.hyper_map(ops.partial(ema_update, self.decay), self.ema_weight,
                                                   self.weights))

    import mindspore as ms
    return EmaClipTrainStep(network_with_loss, optimizer)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="steps of the one epoch")
    parser.add_argument("--poison", type=int, default=20, help="1-based global step whose batch has a blank row")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--model", choices=("mlp", "resnet18"), default="mlp",
                        help="mlp (the blank row above) or resnet18: 32x32 images, one pixel of the poisoned step's "
                             "first image is 3e37, so the stem convolution overflows to Inf")
    parser.add_argument("--train-step", choices=("plain", "ema_clip"), default="plain",
                        help="plain: Model(net, loss, opt); ema_clip: a mindcv-style train step that clips the "
                             "gradients by global norm and keeps an EMA of the weights")
    parser.add_argument("--guard", action="store_true", help="train with mindguard.Guard()")
    parser.add_argument("--dump-iteration", type=int, default=None, help="DumpOnDemand this 0-based iteration")
    parser.add_argument("--dump-path", default=None)
    parser.add_argument("--dump-all", default=None, metavar="PATH", help="dump every iteration into PATH")
    args = parser.parse_args(argv)

    import mindspore as ms
    from mindspore import nn
    from mindspore.train import Model

    import mindguard
    import workloads

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    mindguard.fix_randomness(0)
    if args.model == "mlp":
        net, loss_fn = workloads.build("mlp", hidden=args.hidden, normalize_input=True)
        arrays = workloads.batches("mlp", args.steps, batch=args.batch)
        arrays["x"][(args.poison - 1) * args.batch] = 0.0  # a blank sample in the poisoned step's batch
    else:
        net, loss_fn = workloads.build("resnet18")
        arrays = workloads.batches("resnet18", args.steps, batch=args.batch)
        arrays["x"][(args.poison - 1) * args.batch, 0, 16, 16] = 3e37  # overflows the stem convolution
    optimizer = nn.Momentum(net.trainable_params(), 0.01, 0.9)
    if args.train_step == "ema_clip":
        model = Model(ema_clip_train_step(nn.WithLossCell(net, loss_fn), optimizer))
    else:
        model = Model(net, loss_fn, optimizer)
    callbacks = []
    if args.guard:
        callbacks.append(mindguard.Guard())
    if args.dump_iteration is not None:
        callbacks.append(mindguard.dump.DumpOnDemand(args.dump_iteration, path=args.dump_path, net_name="Net"))
    if args.dump_all:
        mindguard.dump.enable_dump(mindguard.dump.DumpConfig(args.dump_all, "Net", "all"))
    start = time.perf_counter()
    model.train(1, workloads.dataset(arrays, args.batch), callbacks=callbacks, dataset_sink_mode=False)
    print(f"trained in {time.perf_counter() - start:.2f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
