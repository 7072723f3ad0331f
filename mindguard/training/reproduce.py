"""Make a failing run repeat at the same step: seeds, dataset shuffle, initial weights, dropout.

Three tools, usable alone or together:

- :func:`fix_randomness` seeds every random source MindSpore training draws from (call it first);
- :func:`save_params` / :func:`load_params` (:mod:`.saved_params`) store a network's parameters as one ``.npy`` per
  parameter plus a ``manifest.json`` with checksums, so two runs can start from bit-identical weights;
- :class:`Reproducible`, a callback that checks the run is reproducible when training starts (seed
  fixed? dataset shuffled?), pins the initial weights, and can switch dropout off.
"""
from __future__ import annotations

import logging
import os
import random
import re
import sys
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import numpy as np
import mindspore
import mindspore.dataset as ds
from mindspore import nn
from mindspore.train import Callback

from .._util import io as _io
from .seed import current_seed, note_fixed_seed, note_numpy_seed  # noqa: F401 - current_seed: reproduce's API
from ..nn.cells import dropout_classes, put_back_cells, replace_cells
from ..errors import ArgumentError, ArgumentTypeError, ReproducibilityError, ReproducibilityWarning
from .run import current_run
from .saved_params import MANIFEST, refuse_unmanaged_npy
# save_params/load_params live in saved_params.py; this module keeps offering them (mindguard.save_params)
from .saved_params import MANIFEST_FORMAT, MANIFEST_SCHEMA, load_params, save_params  # noqa: F401

_DETERMINISTIC_SET_HERE = False
_THREADS_SET_HERE = False

logger = logging.getLogger("mindguard")

_CHECK_CHOICES = ("warn", "raise", "ignore")


note_numpy_seed()   # a seed the script passes to numpy.random.seed from now on is known (current_seed)


# --------------------------------------------------------------------------------------------- seeds

def fix_randomness(seed: int = 0, *, deterministic: bool = True, cpu_single_thread: bool = False) -> Dict[str, Any]:
    """Seed every random source of a MindSpore training run. Call it first: **before the network is built**.

    Parameter initialisers draw from numpy's global RNG when a layer is constructed, and ``nn.Dropout``
    bakes its seed into its primitive in ``__init__``: seeding after the network exists (e.g. from a
    callback) is too late for both.

    Side effects (all process-wide):

    - ``random.seed(seed)`` (Python's ``random`` module);
    - ``numpy.random.seed(seed)`` (numpy's global RNG);
    - ``mindspore.set_seed(seed)``: MindSpore's global seed (initialisers, random ops' seeds, whose op-seed
      counter it resets) and the dataset pipeline's seed (``mindspore.dataset.config.set_seed``: shuffle
      order, random samplers, random augmentations); verified and set directly if a version does not;
    - ``os.environ["PYTHONHASHSEED"] = str(seed)``: affects **child** processes only (dataset workers
      started later, subprocesses); this process's ``hash()`` was randomised at start-up. It is not restored;
    - ``deterministic=True``: ``mindspore.set_deterministic(True)`` (``set_context(deterministic="ON")`` on
      versions without it), which MindSpore allows once per process: if it was already configured it is
      left as is and the returned dict says so. MindSpore also sets ``HCCL_DETERMINISTIC=true`` and
      ``TE_PARALLEL_COMPILER=1`` in ``os.environ`` then. It matters on Ascend (deterministic reductions
      and collectives); on CPU it has no visible effect;
    - ``cpu_single_thread=True``: ``mindspore.device_context.cpu.op_tuning.threads_num(1)`` (also once per
      process), so CPU kernels run on one thread. On CPU this is what makes ``nn.Dropout`` repeat: its
      kernel fills the mask from several threads, and with more than one thread runs diverge even with
      every seed fixed. It slows CPU training down.

    Calling it again (same or another seed) re-seeds; the once-per-process settings are skipped.

    Args:
        seed: integer in ``[0, 2**32)``.
        deterministic: turn on MindSpore's deterministic computing.
        cpu_single_thread: run CPU kernels on one thread (needed for reproducible dropout on CPU).

    Returns:
        dict: what was set, e.g. ``{"seed": 0, "random": 0, "numpy": 0, "mindspore": 0, "dataset": 0,
        "PYTHONHASHSEED": "0", "deterministic": True, "cpu_threads": 1}``; ``"deterministic"`` is
        ``"already configured: ON"`` (or similar) and ``"cpu_threads"`` ``"already configured"`` when another
        call set them first, and ``None`` when not requested. Also logged at INFO on the ``"mindguard"`` logger.

    Raises:
        TypeError: ``seed`` is not an ``int`` (``bool`` is refused too), or a flag is not a ``bool``.
        ValueError: ``seed`` is outside ``[0, 2**32)``.
    """
    _check_seed(seed)
    for flag, value in (("deterministic", deterministic), ("cpu_single_thread", cpu_single_thread)):
        if not isinstance(value, bool):
            raise ArgumentTypeError(f"fix_randomness({flag}=...) must be True or False, got {value!r}")

    random.seed(seed)
    np.random.seed(seed)
    mindspore.set_seed(seed)
    if ds.config.get_seed() != seed:  # set_seed does this in 2.x; be sure on other versions
        ds.config.set_seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    done: Dict[str, Any] = {"seed": seed, "random": seed, "numpy": seed, "mindspore": mindspore.get_seed(),
                            "dataset": ds.config.get_seed(), "PYTHONHASHSEED": str(seed),
                            "deterministic": _set_deterministic() if deterministic else None,
                            "cpu_threads": _set_single_thread() if cpu_single_thread else None}
    note_fixed_seed(seed)
    logger.info("fix_randomness: %s", done)
    return done


def _check_seed(seed: Any) -> None:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ArgumentTypeError(f"fix_randomness(seed={seed!r}): the seed must be an int in [0, 2**32), "
                        f"got {type(seed).__name__}; pass e.g. fix_randomness(0)")
    if not 0 <= int(seed) < 2 ** 32:
        raise ArgumentError(f"fix_randomness(seed={seed}): the seed must be in [0, 2**32) "
                         f"(numpy and MindSpore's dataset seed are 32-bit unsigned); pass e.g. seed % 2**32")


def _set_deterministic() -> Union[bool, str]:
    global _DETERMINISTIC_SET_HERE

    if _DETERMINISTIC_SET_HERE:
        return True
    if hasattr(mindspore, "set_deterministic"):
        try:
            from mindspore.device_manager import DeviceManagerConf

            configured = DeviceManagerConf.get_instance().is_deterministic_configured()
        except (ImportError, AttributeError):
            configured = False
        if configured:
            state = _deterministic_state()
            if state != "ON":
                logger.warning("fix_randomness: MindSpore's deterministic mode was already configured (%s) "
                               "and can be set only once per process; left as is", state)
            return f"already configured: {state}"
        mindspore.set_deterministic(True)
    else:  # MindSpore < 2.5
        mindspore.set_context(deterministic="ON")
    _DETERMINISTIC_SET_HERE = True
    return True


def _deterministic_state() -> str:
    try:
        return str(mindspore.get_context("deterministic"))
    except (ValueError, KeyError):
        return "unknown"


def _set_single_thread() -> Union[int, str]:
    global _THREADS_SET_HERE
    if _THREADS_SET_HERE:
        return 1
    try:
        from mindspore.device_context.cpu import op_tuning
    except ImportError:  # older MindSpore: the context option
        mindspore.set_context(runtime_num_threads=1)
        _THREADS_SET_HERE = True
        return 1
    try:
        from mindspore._c_expression import RuntimeConf  # pylint: disable=no-name-in-module

        configured = RuntimeConf.get_instance().is_op_threads_num_configured()
    except (ImportError, AttributeError):
        configured = False
    if configured:
        logger.warning("fix_randomness(cpu_single_thread=True): the CPU kernel thread count was already set "
                       "(mindspore.device_context.cpu.op_tuning.threads_num can be set once per process); left "
                       "as is. If it is not 1, dropout on CPU will not repeat.")
        return "already configured"
    op_tuning.threads_num(1)
    _THREADS_SET_HERE = True
    return 1


# ------------------------------------------------------------------------------------ saved params


# -------------------------------------------------------------------------------------- callback

def shuffling_ops(dataset) -> List[str]:
    """Describe every operation of a dataset pipeline that shuffles, walking from ``dataset`` to its sources.

    A ``.shuffle(buffer_size)`` op, or a source whose sampler shuffles (``shuffle=True`` or the default
    for most sources, ``RandomSampler``, ``DistributedSampler(shuffle=True)``, ...). An iterable
    ``GeneratorDataset`` source (no ``__getitem__``) cannot shuffle and is not reported.
    """
    found, stack, seen = [], [dataset], set()
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        kind = type(node).__name__
        children = list(getattr(node, "children", None) or [])
        if kind == "ShuffleDataset":
            found.append(f"ShuffleDataset (.shuffle(buffer_size={getattr(node, 'buffer_size', '?')}))")
        elif not children and _source_shuffles(node):
            sampler = getattr(node, "sampler", None)
            how = (f"sampler={type(sampler).__name__}" if sampler is not None
                   else f"shuffle={getattr(node, 'shuffle_flag', '?')}")
            found.append(f"{kind} ({how}; pass shuffle=False to keep the order)")
        stack.extend(children)
    return found


def _source_shuffles(node) -> bool:
    if type(node).__name__ == "GeneratorDataset" and not hasattr(getattr(node, "source", None), "__getitem__"):
        return False
    sampler = getattr(node, "sampler", None)
    try:
        if sampler is not None:
            return bool(sampler.is_shuffled())
        return bool(node.is_shuffled())
    except (NotImplementedError, AttributeError, TypeError):
        return False


def _repeats_dropout(version: str) -> bool:
    """False for MindSpore 2.7.x (and older): seeded runs with dropout are not bit-identical there."""
    numbers = re.match(r"(\d+)\.(\d+)", str(version))
    return numbers is None or (int(numbers.group(1)), int(numbers.group(2))) >= (2, 8)


def _dataset_seed_fixed() -> bool:
    return current_seed() is not None or mindspore.get_seed() is not None or ds.config.get_seed() != 5489


class Reproducible(Callback):
    """Callback that makes a run repeat: checks seeds and shuffling, pins initial weights, removes dropout.

    Everything happens in ``on_train_begin``, before the graph compiles at step 1:

    1. If :func:`fix_randomness` was not called in this process: ``check_seed`` decides (``"warn"``
       a :class:`ReproducibilityWarning`, ``"raise"`` a :class:`ReproducibilityError`, ``"ignore"``).
    2. If the training dataset pipeline shuffles (a ``.shuffle()`` op, or a source with a shuffling
       sampler) while the dataset seed is not fixed, ``check_shuffle`` decides the same way; the message
       names each shuffling op. With a fixed seed the order repeats, and it is only logged at INFO.
    3. ``disable_dropout=True``: every ``nn.Dropout``/``Dropout1d/2d/3d`` (and ``mint.nn`` dropouts) in
       the train network is replaced by ``nn.Identity`` (via :func:`mindguard.replace_cells`).
    4. ``init_params_dir``: on the first run (no ``manifest.json`` there) the network's initial
       parameters are saved (:func:`save_params`); on every later run they are loaded (:func:`load_params`)
       so runs start from identical weights even with different or no seeds.
    5. On MindSpore 2.7.x, which does not repeat dropout bit for bit even fully seeded, a train network
       with dropout (and ``disable_dropout=False``) is reported, naming the version and the fix (upgrade to
       >= 2.8, or ``disable_dropout=True``): a :class:`ReproducibilityError` if ``check_seed`` or
       ``check_shuffle`` is ``"raise"``, else a warning unless both are ``"ignore"``.

    After ``on_train_begin``: ``replaced_dropout`` (names), ``params_action`` (``"saved"``/``"loaded"``/None),
    ``shuffling`` (op descriptions).
    """

    def __init__(self, init_params_dir: Optional[_io.PathLike] = None, *, disable_dropout: bool = False,
                 check_shuffle: str = "warn", check_seed: str = "warn"):
        super().__init__()
        if init_params_dir is not None and (not isinstance(init_params_dir, (str, os.PathLike))
                                            or not str(init_params_dir)):
            raise ArgumentTypeError(f"Reproducible(init_params_dir=...) must be None or a path, "
                                    f"got {init_params_dir!r}")
        if not isinstance(disable_dropout, bool):
            raise ArgumentTypeError(f"Reproducible(disable_dropout=...) must be True or False, got {disable_dropout!r}")
        for arg, value in (("check_shuffle", check_shuffle), ("check_seed", check_seed)):
            if value not in _CHECK_CHOICES:
                raise ArgumentError(f"Reproducible({arg}={value!r}): must be one of {list(_CHECK_CHOICES)}")
        self.init_params_dir = Path(init_params_dir).expanduser() if init_params_dir is not None else None
        self.disable_dropout = disable_dropout
        self.check_shuffle = check_shuffle
        self.check_seed = check_seed
        self.replaced_dropout: List[str] = []
        self._swapped: Dict[int, nn.Cell] = {}   # id(nn.Identity put in) -> the dropout cell it stands for
        self._network: Optional[nn.Cell] = None
        self.params_action: Optional[str] = None
        self.shuffling: List[str] = []

    def on_train_begin(self, run_context) -> None:
        cb_params = run_context.original_args()
        first_call = current_run().global_step == 0  # nothing trained yet in this process
        if current_seed() is None and first_call:
            self._report(self.check_seed, "check_seed",
                         "mindguard.fix_randomness(seed) was not called before training, nor mindspore.set_seed "
                         "or numpy.random.seed: initial weights, dropout masks and the shuffle order change from run "
                         "to run. Call it first thing in the script, before building the network.")
        dataset = cb_params.get("train_dataset")
        self.shuffling = shuffling_ops(dataset) if dataset is not None else []
        if self.shuffling:
            if _dataset_seed_fixed():
                logger.info("Reproducible: the dataset shuffles (%s) with a fixed seed; its order repeats",
                            "; ".join(self.shuffling))
            else:
                self._report(self.check_shuffle, "check_shuffle",
                             f"the training dataset shuffles with an unfixed seed: {'; '.join(self.shuffling)}. "
                             f"Its order changes from run to run: call mindguard.fix_randomness(seed) before "
                             f"model.train, or turn shuffling off.")
        train_network = cb_params.get("train_network")
        if not self.disable_dropout and train_network is not None:
            self._check_version_repeats(train_network)
        if self.disable_dropout and train_network is not None:
            classes = dropout_classes()

            def identity(old: nn.Cell) -> nn.Cell:
                new = nn.Identity()
                self._swapped[id(new)] = old
                return new

            self._network = train_network
            self.replaced_dropout = replace_cells(train_network, lambda cell: isinstance(cell, classes), identity)
            if self.replaced_dropout:   # the user asked for it: said once, undone when the training call ends
                print(f"mindguard: disable_dropout=True: dropout off for this training call in "
                      f"{', '.join(self.replaced_dropout[:5])}"
                      f"{f' and {len(self.replaced_dropout) - 5} more' if len(self.replaced_dropout) > 5 else ''} "
                      f"(nn.Identity in their place until the call ends)", file=sys.stderr, flush=True)
        if self.init_params_dir is not None and not first_call:
            logger.info("Reproducible: initial parameters were pinned before the first step of this process; a "
                        "later training call keeps the weights it starts from")
        elif self.init_params_dir is not None:
            network = cb_params.get("network") or train_network
            if (self.init_params_dir / MANIFEST).exists():
                load_params(network, self.init_params_dir)
                self.params_action = "loaded"
            else:
                refuse_unmanaged_npy(self.init_params_dir)
                save_params(network, self.init_params_dir)
                self.params_action = "saved"
            logger.info("Reproducible: initial parameters %s (%s)", self.params_action, self.init_params_dir)

    def on_train_end(self, run_context) -> None:
        """The dropout cells ``disable_dropout`` replaced go back in place: after training the network holds the
        user's cells (and a later compile uses them)."""
        self._put_back()

    def __exit__(self, *exc_info: Any) -> None:
        self._put_back()   # also when the training raised (on_train_end does not run then)

    def _put_back(self) -> None:
        if self._swapped and self._network is not None:
            put_back_cells(self._network, self._swapped)
        self._swapped, self._network = {}, None

    def _check_version_repeats(self, train_network) -> None:
        """MindSpore 2.7 does not repeat dropout bit for bit, even fully seeded on one CPU thread."""
        if _repeats_dropout(mindspore.__version__):
            return
        classes = dropout_classes()
        dropout = [name for name, cell in train_network.cells_and_names() if isinstance(cell, classes)]
        if dropout:
            checks = (self.check_seed, self.check_shuffle)
            action = "raise" if "raise" in checks else "warn" if "warn" in checks else "ignore"
            self._report(action, "check_seed/check_shuffle",
                         f"the installed MindSpore {mindspore.__version__} does not repeat dropout "
                         f"({', '.join(dropout[:3])}) bit for bit: with every seed fixed "
                         f"(fix_randomness(seed, cpu_single_thread=True)), reruns diverge after a few steps, "
                         f"with or without a shuffling dataset (measured on CPU with 2.7.0 and 2.7.2; 2.8+ repeats). "
                         f"Fix: upgrade to MindSpore >= 2.8 (pip install 'mindspore>=2.8'), or pass "
                         f"Reproducible(disable_dropout=True).")

    @staticmethod
    def _report(action: str, option: str, message: str) -> None:
        if action == "raise":
            raise ReproducibilityError(message + f" (raised because {option}='raise'; 'warn' only warns)")
        if action == "warn":   # one warning (shown once by Python's filter); a logger line too would repeat it
            warnings.warn(message, ReproducibilityWarning, stacklevel=3)
