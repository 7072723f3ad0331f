"""A hunt's later passes start near the failure instead of at step 1.

The record pass keeps, from time to time, a host copy of the training's *state* -- every Parameter of the
train network: weights, buffers (BatchNorm statistics), the optimizer's moments, ``global_step`` and
learning rate, a loss scale -- taken at the beginning of a step, before it runs (:class:`StateKeeper`). When
the run fails, the latest copy taken at or before the first step that can be the failing one is written to
the hunt's run folder. A later pass of the same script resumes from it (:class:`Resumer`): the training calls
of the steps before it are *skipped* -- the dataset still delivers every batch, in order, and every callback
runs, but the train network is not called (it returns zeros shaped like its real output) -- and at its step
the state is assigned and training goes on for real. Its cost is the data pipeline's for the skipped steps
(nearly nothing when a ``Model.train`` call's dataset can be reset there instead:
:mod:`mindguard.training.state.dataset_skip`),
one compile, and the steps from the kept one on.

The random state is kept with it and restored at the kept step (:mod:`mindguard.training.state.rng`: numpy's, Python's
and MindSpore's default generator). What a resumed pass cannot restore: random state inside the step's kernels
(``nn.Dropout``'s masks, random ops seeded once -- the kept state names such cells, and the hunt then runs from
step 1), Python state the script changes per step outside Parameters. And in the skipped steps the
script's callbacks see a zero loss and the untrained weights (a checkpoint callback saves those). The hunt checks that
the resumed
pass fails at the same step in the same way, and otherwise re-runs from step 1.

An always-on Guard copies the state only when the copy is at most :data:`MAX_EXTRA_MEMORY` of the process's
resident memory, and writes it to disk in a thread of its own; its other resume points are the training's own
``ModelCheckpoint`` files (:class:`CheckpointPoint`: a ``state.json`` naming the file, the random state in
``state.npz``).

Steps are 1-based, process-wide global steps (:mod:`mindguard.training.run`). Files: ``<dir>/state.json`` (the step,
names, shapes, dtypes, the output structure, timing), ``<dir>/state.npz`` (one array per Parameter, read with
``allow_pickle=False``) but for arrays of 16 MB or more, each in ``<dir>/p<i>.npy`` (``state.json``'s ``files``, with
their checksums), every file written atomically.

This module is the face of that machinery; the code lives in :mod:`mindguard.training.state.keeper` (keeping),
:mod:`mindguard.training.state.resumer` (resuming), :mod:`mindguard.training.state.state_files` (the values keeping and
resuming share), :mod:`mindguard.training.state.state_folder` (an always-on Guard's run folders) and
:mod:`mindguard.protocol.kept_state` (reading, checking, choosing and describing a kept state: pure file reading the
hunt shares, re-exported here).
"""
from __future__ import annotations

from ...protocol.kept_state import (
    STATE_SCHEMA,
    check_state,
    choose_kept_state,
    describe_state,
    last_complete_state,
    read_state_meta,
    unrestorable_note,
)
from .keeper import MAX_EXTRA_MEMORY, CheckpointPoint, KeptState, StateKeeper, note_initial
from .resumer import Resumer, hold_checkpoints, overridden_edits
from .state_files import (
    capture_random_state,
    checkpoint_callbacks,
    fingerprint,
    output_spec,
    placeholder,
    restore_random_state,
    small_parameters,
    small_state,
    state_parameters,
)
from .state_folder import claim_run_states, clean_stale_states, drop_run_states, release_run_states

__all__ = ["MAX_EXTRA_MEMORY", "STATE_SCHEMA", "CheckpointPoint", "KeptState", "Resumer", "StateKeeper",
           "capture_random_state", "check_state", "checkpoint_callbacks", "choose_kept_state", "claim_run_states",
           "clean_stale_states", "describe_state", "drop_run_states", "fingerprint", "hold_checkpoints",
           "last_complete_state", "note_initial", "output_spec", "overridden_edits", "placeholder", "read_state_meta",
           "release_run_states", "restore_random_state", "small_parameters", "small_state", "state_parameters",
           "unrestorable_note"]
