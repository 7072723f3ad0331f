"""A small Model.train training with an always-on Guard, for the tests of a failure's evidence (tests/test_evidence.py):
the record and the kept states of one run must survive the next run, a concurrent run, a kill, a cut write.

Model: token embedding -> nn.Norm -> dense. The batch of global step ``--poison`` (1-based) is padded, so nn.Norm's
sqrt(0) backward makes the embedding NaN at that step (``--poison 0``: a healthy run).

    python evidence_train.py --poison 12               # fails at global step 12
    python evidence_train.py --meet DIR                  # waits at step 3 until another run reached it too
    python evidence_train.py --kill-at 9                 # SIGKILLs itself at the end of global step 9
    python evidence_train.py --poison 12 --cut-write     # SIGKILLs itself while the failure's state is written

``--disk-until N``: Guard keeps a copy of the state at every step and writes each to disk before global step N,
then keeps none (a test's stand-in for its every-30-seconds cadence on a long run: nothing more in a run this short;
set on the run's keeper once Guard made it). Outside ``mindguard hunt`` only (the hunt's passes run the script as is).
"""
import argparse
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

VOCAB, DIM, LEN, BATCH, STEPS = 40, 8, 6, 4, 16


def batches(poison):
    rng = np.random.default_rng(0)
    for step in range(1, STEPS + 1):
        tokens = rng.integers(1, VOCAB, size=(BATCH, LEN)).astype(np.int32)
        if step == poison:
            tokens[:, 2:] = 0
        yield tokens, ((tokens > 0).sum(axis=1, keepdims=True) / LEN).astype(np.float32)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--poison", type=int, default=12)
    parser.add_argument("--meet", default=None)
    parser.add_argument("--kill-at", type=int, default=0)
    parser.add_argument("--cut-write", action="store_true")
    parser.add_argument("--disk-until", type=int, default=0)
    args = parser.parse_args()

    import mindspore as ms
    import mindspore.dataset as ds
    from mindspore import nn
    from mindspore.train import Callback, Model

    import mindguard
    import mindguard.training.state.resume
    from mindguard.training.run import current_run

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    mindguard.fix_randomness(0)
    under_hunt = bool(os.environ.get("MINDGUARD_HUNT_PASS"))

    class Bag(nn.Cell):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(VOCAB, DIM, padding_idx=0)   # LAYER
            self.norm = nn.Norm(axis=-1)
            self.head = nn.Dense(LEN, 1)

        def construct(self, tokens):
            return self.head(self.norm(self.embedding(tokens)))  # CULPRIT

    class Faults(Callback):
        def on_train_step_end(self, run_context):
            step = run_context.original_args().get("cur_step_num")
            keeper = current_run().state.keeper
            if args.disk_until and keeper is not None and keeper.on_disk:
                early = step < args.disk_until
                schedule = keeper.schedule
                schedule.every_steps, schedule.budget, schedule.disk_seconds = (1, 1.0, 0.0) if early else (
                    1 if args.cut_write else None, 0.005, 1e9)   # (--cut-write: a copy in memory at every step)
                # then no copy (but --cut-write's), so no check wanted before one: the Parameters are checked on
                # the budget alone, which a run this short leaves after its probes (deterministic, whatever the
                # machine's speed: a copy due by time wanted a check the step before it, at 11 or at 13)
                schedule.steps = set() if early or args.cut_write else {0}
            if args.meet and step == 3:
                here = Path(args.meet)
                (here / str(os.getpid())).touch()
                deadline = time.monotonic() + 240
                while len(list(here.iterdir())) < 2 and time.monotonic() < deadline:
                    time.sleep(0.05)
            if args.kill_at and step == args.kill_at and not under_hunt:
                os.kill(os.getpid(), signal.SIGKILL)

    if args.cut_write and not under_hunt:
        class CutNumpy:
            """numpy, but its savez of a state at the failure writes part of the file and SIGKILLs the process."""

            def __getattr__(self, name):
                return getattr(np, name)

            def savez(self, file, **arrays):
                if current_run().failure is not None:
                    file.write(b"PK\x03\x04" + b"\0" * 65536)
                    file.flush()
                    os.kill(os.getpid(), signal.SIGKILL)
                return np.savez(file, **arrays)

        mindguard.training.state.state_writer.np = CutNumpy()   # (KeptState.write saves the arrays)

    net = Bag()
    data = ds.GeneratorDataset(list(batches(args.poison)), ["tokens", "label"], shuffle=False)
    model = Model(net, nn.MSELoss(), nn.Adam(net.trainable_params(), learning_rate=0.01))   # LR
    guard = mindguard.Guard(check_budget=1e-6)
    model.train(1, data, callbacks=[guard, Faults()], dataset_sink_mode=False)
    print(f"failure: {guard.failure}" if guard.failure is not None else "trained")
    return 1 if guard.failure is not None else 0


if __name__ == "__main__":
    sys.exit(main())
