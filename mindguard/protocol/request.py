"""The hunt's request: what ``mindguard hunt`` asks of the training process it runs, through ``MINDGUARD_*``
environment variables. This module is the only code that reads or writes them (a test checks it).

Steps are 1-based, process-wide global steps (:mod:`mindguard.training.run`). Never imports MindSpore: the hunt's own
process uses it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Mapping, Optional, Tuple

from ..errors import HuntProtocolError

# -- the hunt protocol: what `mindguard hunt` sets for the command it runs ------------------------------
ENV_PASS = "MINDGUARD_HUNT_PASS"             # "record" (find the failing step) | "examine" (look at that step)
ENV_RECORD = "MINDGUARD_RECORD"              # the failure record path (per rank: name.rankN.json)
ENV_NET_NAME = "MINDGUARD_NET_NAME"          # the dump's net_name
ENV_CAPTURE_DIR = "MINDGUARD_CAPTURE_DIR"    # where a step is captured for replay
ENV_REPLAY_REPORT = "MINDGUARD_REPLAY_REPORT"  # where a replay's report (JSON; .txt beside it) goes
ENV_OBSERVE_PATH = "MINDGUARD_OBSERVE_PATH"  # record pass: root of the observing dump (iteration ids only)
ENV_EXAMINE_STEP = "MINDGUARD_EXAMINE_STEP"  # examine pass: the 1-based, process-wide global step to examine
ENV_EXAMINE = "MINDGUARD_EXAMINE"            # examine pass: "dump" | "replay" | "dataset"
ENV_DUMP_PATH = "MINDGUARD_DUMP_PATH"        # examine pass, "dump": root of the dump the hunt armed
ENV_KEEP_DIR = "MINDGUARD_KEEP_DIR"          # where the training state kept before the failure is written
ENV_KEEP_EVERY = "MINDGUARD_KEEP_EVERY"      # keep the state every N steps (default: by time, <= 0.5 % cost)
ENV_KEEP_STEPS = "MINDGUARD_KEEP_STEPS"      # keep the state at exactly these steps: "first-last"
ENV_RESUME_DIR = "MINDGUARD_RESUME_DIR"      # start from this kept state: skip the steps before it
ENV_NO_FAST_FORWARD = "MINDGUARD_NO_FAST_FORWARD"   # "1": skip by iterating the dataset, not by resetting it
ENV_APPROXIMATE = "MINDGUARD_APPROXIMATE"    # "1": a resumed pass does not compare what it computes with the
#                                                  trace of the run that kept the state (that state cannot hold every
#                                                  random source: dropout kernels draw other masks)
ENV_VERIFY_STEPS = "MINDGUARD_VERIFY_STEPS"  # `mindguard verify`: "first-through": note each step's loss from first,
                                             # stop before step through+1; the kept state loads into an edited model
PASSES = ("record", "examine")
EXAMINATIONS = ("dump", "replay", "dataset")
_ALL_ENV = (ENV_PASS, ENV_RECORD, ENV_NET_NAME, ENV_CAPTURE_DIR, ENV_REPLAY_REPORT, ENV_OBSERVE_PATH,
            ENV_EXAMINE_STEP, ENV_EXAMINE, ENV_DUMP_PATH, ENV_KEEP_DIR, ENV_KEEP_EVERY, ENV_KEEP_STEPS,
            ENV_RESUME_DIR, ENV_NO_FAST_FORWARD, ENV_VERIFY_STEPS, ENV_APPROXIMATE)


def record_from_environ(env: Mapping[str, str] = os.environ) -> Optional[Path]:
    """The record path ``mindguard hunt`` set for this process (``None`` outside the hunt), read on its own: a
    process whose request cannot be parsed still says, beside it, how it ended (:mod:`.pass_status`)."""
    record = env.get(ENV_RECORD) if env.get(ENV_PASS) else None
    return Path(record) if record else None


@dataclass(frozen=True)
class HuntRequest:
    """What ``mindguard hunt`` asks of the training process (parsed once from the environment).

    ``pass_name``: ``"record"`` (pass 1: find the failing step) or ``"examine"`` (pass 2: look at exactly
    ``examine_step``, a 1-based process-wide global step, by ``examine``: ``"dump"`` -- the hunt armed
    MindSpore's dump of that step's iteration into ``dump_path``; ``"replay"`` -- capture the step and replay
    it eagerly; ``"dataset"`` -- run the dataset pipeline synchronously so an exception arrives at the step
    whose batch raised). ``observe_path``: in the record pass, the observing dump's root.

    Resuming (:mod:`mindguard.training.state.resume`): ``keep_dir`` -- keep the training state from time to time (every
    ``keep_every`` steps, or at exactly the steps ``keep_steps``) and write the one before the failure there;
    ``resume_dir`` -- start from the state kept there (the steps before it are skipped); ``fast_forward`` -- a
    ``Model.train`` call's dataset may be reset to the kept step instead of iterated there
    (``mindguard.training.state.dataset_skip``; the hunt turns it off when a pass that used it computed something else).

    ``verify_steps`` (``mindguard verify``'s pass, :mod:`mindguard.training.child.verify_run`): ``(first, through)``,
    1-based global steps -- each step's loss from ``first`` on is noted, the process stops before step ``through + 1``,
    and the kept state is loaded into the script as edited (a resumed run is not compared with the failing one).
    """

    pass_name: str
    record: Path
    net_name: str = "Net"
    capture_dir: Optional[Path] = None
    replay_report: Optional[Path] = None
    observe_path: Optional[Path] = None
    examine_step: Optional[int] = None
    examine: Optional[str] = None
    dump_path: Optional[Path] = None
    keep_dir: Optional[Path] = None
    keep_every: Optional[int] = None
    keep_steps: Optional[Tuple[int, int]] = None
    resume_dir: Optional[Path] = None
    fast_forward: bool = True
    verify_steps: Optional[Tuple[int, int]] = None
    approximate: bool = False

    @classmethod
    def from_environ(cls, env: Mapping[str, str] = os.environ) -> Optional["HuntRequest"]:
        """The request in ``env``, or ``None`` when not run by ``mindguard hunt``."""
        pass_name = env.get(ENV_PASS) or None
        if pass_name is None:
            return None
        if pass_name not in PASSES:
            raise HuntProtocolError(f"{ENV_PASS}={pass_name!r}: expected one of {list(PASSES)} (set by "
                                    f"`mindguard hunt`; unset it to train without the hunt)")
        record = env.get(ENV_RECORD)
        if not record:
            raise HuntProtocolError(f"{ENV_PASS}={pass_name!r} without {ENV_RECORD}: run the script through "
                                    f"`mindguard hunt -- ...`, or unset {ENV_PASS}")

        def path(name: str) -> Optional[Path]:
            value = env.get(name)
            return Path(value) if value else None

        step = examine = None
        if pass_name == "examine":
            raw = env.get(ENV_EXAMINE_STEP, "")
            if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
                raise HuntProtocolError(f"{ENV_EXAMINE_STEP}={raw!r}: expected the 1-based global step to examine "
                                        f"(set by `mindguard hunt`)")
            step = int(raw)
            examine = env.get(ENV_EXAMINE, "")
            if examine not in EXAMINATIONS:
                raise HuntProtocolError(f"{ENV_EXAMINE}={examine!r}: expected one of {list(EXAMINATIONS)} (set by "
                                        f"`mindguard hunt`)")
        every = env.get(ENV_KEEP_EVERY) or None
        if every is not None and not (every.isascii() and every.isdigit() and int(every) >= 1):
            raise HuntProtocolError(f"{ENV_KEEP_EVERY}={every!r}: expected a number of steps >= 1 (set by "
                                    f"`mindguard hunt --keep-every`)")
        steps = env.get(ENV_KEEP_STEPS) or None
        window = None
        if steps is not None:
            first, _, last = steps.partition("-")
            if not (first.isascii() and first.isdigit() and last.isascii() and last.isdigit()
                    and 1 <= int(first) <= int(last)):
                raise HuntProtocolError(f"{ENV_KEEP_STEPS}={steps!r}: expected \"first-last\", 1-based global steps "
                                        f"(set by `mindguard hunt`)")
            window = (int(first), int(last))
        verify = _steps_range(env, ENV_VERIFY_STEPS, "`mindguard verify`")
        return cls(pass_name=pass_name, record=Path(record), net_name=env.get(ENV_NET_NAME) or "Net",
                   capture_dir=path(ENV_CAPTURE_DIR), replay_report=path(ENV_REPLAY_REPORT),
                   observe_path=path(ENV_OBSERVE_PATH), examine_step=step, examine=examine,
                   dump_path=path(ENV_DUMP_PATH), keep_dir=path(ENV_KEEP_DIR),
                   keep_every=int(every) if every is not None else None, keep_steps=window,
                   resume_dir=path(ENV_RESUME_DIR), fast_forward=env.get(ENV_NO_FAST_FORWARD) != "1",
                   verify_steps=verify, approximate=env.get(ENV_APPROXIMATE) == "1")

    def to_environ(self) -> Dict[str, str]:
        """The variables that make :meth:`from_environ` return this request (what the hunt exports)."""
        values = {ENV_PASS: self.pass_name, ENV_RECORD: str(self.record), ENV_NET_NAME: self.net_name,
                  ENV_CAPTURE_DIR: self.capture_dir, ENV_REPLAY_REPORT: self.replay_report,
                  ENV_OBSERVE_PATH: self.observe_path, ENV_EXAMINE_STEP: self.examine_step,
                  ENV_EXAMINE: self.examine, ENV_DUMP_PATH: self.dump_path, ENV_KEEP_DIR: self.keep_dir,
                  ENV_KEEP_EVERY: self.keep_every, ENV_RESUME_DIR: self.resume_dir,
                  ENV_KEEP_STEPS: f"{self.keep_steps[0]}-{self.keep_steps[1]}" if self.keep_steps else None,
                  ENV_NO_FAST_FORWARD: None if self.fast_forward else "1",
                  ENV_VERIFY_STEPS: f"{self.verify_steps[0]}-{self.verify_steps[1]}" if self.verify_steps else None,
                  ENV_APPROXIMATE: "1" if self.approximate else None}
        return {k: str(v) for k, v in values.items() if v is not None}

    @staticmethod
    def clear(env: Dict[str, str]) -> None:
        """Remove every variable of the protocol from ``env`` (in place)."""
        for name in _ALL_ENV:
            env.pop(name, None)


def _steps_range(env: Mapping[str, str], name: str, by: str) -> Optional[Tuple[int, int]]:
    """``"first-last"`` (1-based global steps, ``1 <= first <= last``) in ``env[name]`` as a pair, or ``None``."""
    steps = env.get(name) or None
    if steps is None:
        return None
    first, _, last = steps.partition("-")
    if not (first.isascii() and first.isdigit() and last.isascii() and last.isdigit() and 1 <= int(first) <= int(last)):
        raise HuntProtocolError(f"{name}={steps!r}: expected \"first-last\", 1-based global steps (set by {by})")
    return int(first), int(last)


def under_hunt(env: Mapping[str, str] = os.environ) -> bool:
    """True in a process that ``mindguard hunt`` runs (one of its passes)."""
    return bool(env.get(ENV_PASS))


def record_override(env: Mapping[str, str] = os.environ) -> Optional[Path]:
    """The record path ``MINDGUARD_RECORD`` sets for every Guard of the process (the hunt's, or the user's own for
    every rank of an msrun job), or ``None``."""
    value = env.get(ENV_RECORD)
    return Path(value).expanduser() if value else None
