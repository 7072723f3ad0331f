"""Data-parallel training on several ranks, guarded by mindguard (launch with MindSpore's ``msrun``).

Each rank trains a small MLP on its shard of a regression dataset; the gradients are averaged by an
AllReduce every step. ``--poison-rank 1 --poison-step 5`` puts an Inf into one feature of the batch that
rank 1 trains on at global step 5 -- a broken record in one shard, the way it happens on a real cluster.
Rank 1's loss goes non-finite, its gradients reach rank 0 through the AllReduce, and both ranks' weights
turn NaN in the same step. ``mindguard.Guard`` records that on every rank, names rank 1 as the origin, and
stops all ranks at that step (none hangs in a collective):

    export PATH=$(dirname $(which python)):$PATH      # msrun starts `python` from PATH
    mindguard hunt -- msrun --worker_num=2 --local_worker_num=2 --master_addr=127.0.0.1 \\
        --master_port=8118 --join=True --log_dir=msrun_logs samples/distributed_train.py --poison-rank 1

Without ``mindguard hunt`` the records land in ``mindguard_failure.rank0.json`` / ``.rank1.json``.
``--params-out DIR`` saves each rank's final weights to ``DIR/rank_<r>`` (they must be identical).
"""
import argparse

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn
from mindspore.communication import get_group_size, get_rank, init
from mindspore.context import ParallelMode
from mindspore.train import Callback, Model

import mindguard
from mindguard.training.reproduce import save_params

FEATURES = 8
BATCH = 4


def make_dataset(rank, group_size, steps_per_epoch, poison_rank=None, poison_step=None):
    """This rank's shard: ``steps_per_epoch`` batches of ``BATCH`` rows (rows ``rank::group_size`` of the data).

    ``poison_step`` (1-based global step) on ``poison_rank``: one feature of that batch is ``+inf``.
    """
    rng = np.random.RandomState(0)
    rows = steps_per_epoch * BATCH * group_size
    x = rng.uniform(-1, 1, size=(rows, FEATURES)).astype(np.float32)
    y = (x @ rng.uniform(-1, 1, size=(FEATURES, 1))).astype(np.float32)
    shard = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False, num_shards=group_size, shard_id=rank)

    def poison(features, labels, info):
        global_step = info.get_epoch_num() * steps_per_epoch + info.get_batch_num() + 1  # both 0-based
        features = np.stack(features)
        if rank == poison_rank and global_step == poison_step:
            features[0, 0] = np.inf
        return features, np.stack(labels)

    return shard.batch(BATCH, per_batch_map=poison, input_columns=["x", "y"])


class PrintLoss(Callback):
    def on_train_step_end(self, run_context):
        params = run_context.original_args()
        loss = float(params.get("net_outputs").asnumpy())
        print(f"rank {get_rank()} step {params.get('cur_step_num')}: loss {loss:.6f}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps-per-epoch", type=int, default=4)
    parser.add_argument("--poison-rank", type=int, default=None, help="rank whose shard gets an Inf")
    parser.add_argument("--poison-step", type=int, default=5, help="1-based global step of the poisoned batch")
    parser.add_argument("--no-guard", action="store_true", help="train without mindguard")
    parser.add_argument("--params-out", default=None, help="save each rank's final weights to DIR/rank_<r>")
    args = parser.parse_args()

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    init()  # msrun's environment says which rank this is; CPU uses MindSpore's own mccl collectives
    ms.set_auto_parallel_context(parallel_mode=ParallelMode.DATA_PARALLEL, gradients_mean=True)
    rank, group_size = get_rank(), get_group_size()
    mindguard.fix_randomness(1)  # before building the network: every rank starts from the same weights

    net = nn.SequentialCell([nn.Dense(FEATURES, 16), nn.ReLU(), nn.Dense(16, 1)])
    model = Model(net, nn.MSELoss(), nn.Momentum(net.trainable_params(), learning_rate=0.02, momentum=0.9))
    data = make_dataset(rank, group_size, args.steps_per_epoch, args.poison_rank, args.poison_step)
    callbacks = [PrintLoss()]
    guard = None
    if not args.no_guard:
        guard = mindguard.Guard()
        callbacks.insert(0, guard)
    model.train(args.epochs, data, callbacks=callbacks, dataset_sink_mode=False)

    if guard is not None:
        locator = guard.locator
        print(f"rank {rank}: {locator.failure.format() if locator.failure else 'no failure'}", flush=True)
        if locator.sync_steps:
            print(f"rank {rank}: cross-rank verdict exchange {1000 * locator.sync_seconds / locator.sync_steps:.2f} "
                  f"ms/step over {locator.sync_steps} steps", flush=True)
    if args.params_out:
        save_params(net, f"{args.params_out}/rank_{rank}")


if __name__ == "__main__":
    main()
