"""Verification aid for the zoo scripts (not model-zoo code): ``--watch`` adds this callback.

It prints, independently of mindguard, the first step at which the loss, any Parameter of the train
network (trainable or not: BatchNorm moving statistics too) or the batch is non-finite, with the
process-wide 1-based global step (counted over every training call), the call number and the epoch/step
MindSpore reports in that call. It never stops training.
"""
import os

import numpy as np
from mindspore.train import Callback

_STATE = {"global_step": 0, "call": 0, "reported": False}


def _finite(value):
    try:
        arr = value.asnumpy()
    except AttributeError:
        return True
    if arr.dtype.kind not in "fc":
        return True
    return bool(np.isfinite(arr.astype(np.float64)).all())


class NanWatch(Callback):
    def __init__(self, tag=""):
        super().__init__()
        self.tag = tag

    def on_train_begin(self, run_context):
        _STATE["call"] += 1
        print(f"[watch] training call {_STATE['call']} begins "
              f"({type(run_context.original_args().get('train_network')).__name__}) {self.tag}", flush=True)

    def on_train_step_begin(self, run_context):
        _STATE["global_step"] += 1

    def on_train_step_end(self, run_context):
        if _STATE["reported"]:
            return
        cb = run_context.original_args()
        out = cb.get("net_outputs")
        loss = out[0] if isinstance(out, (tuple, list)) else out
        extra = ""
        if isinstance(out, (tuple, list)) and len(out) > 1:
            extra = f" overflow={out[1]} scale={out[2]}" if len(out) > 2 else f" out1={out[1]}"
        if os.environ.get("NAN_WATCH_VERBOSE"):
            print(f"[watch] step {_STATE['global_step']}: loss={loss} " + " ".join(
                f"{p.name}={float(np.abs(p.asnumpy().astype(np.float64)).max()):.3g}"
                for p in cb.get("train_network").get_parameters() if "moment" not in p.name and "ema" not in p.name),
                flush=True)
        bad_params = [p.name for p in cb.get("train_network").get_parameters() if not _finite(p)]
        bad_inputs = [i for i, t in enumerate(cb.get("train_dataset_element") or []) if not _finite(t)]
        loss_ok = _finite(loss)
        if bad_params or bad_inputs or not loss_ok:
            _STATE["reported"] = True
            batch_num = cb.get("batch_num")
            step_in_epoch = (cb.get("cur_step_num") - 1) % batch_num + 1
            print(f"[watch] FIRST NON-FINITE at global step {_STATE['global_step']} (call {_STATE['call']}, "
                  f"epoch {cb.get('cur_epoch_num')} step {step_in_epoch}/{batch_num}): loss={loss}{extra} "
                  f"non-finite params={bad_params} non-finite inputs={bad_inputs}", flush=True)

    def on_train_end(self, run_context):
        print(f"[watch] training call {_STATE['call']} ended after global step {_STATE['global_step']}", flush=True)
