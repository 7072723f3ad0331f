"""The locate pass that dumps as it goes (mindguard.training.child.window_dump): the files of the steps checked clean
are removed as later steps begin, the last steps' stay, nothing is removed once a failure is recorded, and a file that
cannot be removed stops the pruning without ending the training. Files named as MindSpore names dump files."""
from __future__ import annotations

from pathlib import Path

import pytest

from mindguard.training.child.window_dump import KEPT_BEHIND, DumpPruner

pytestmark = pytest.mark.fast

T0 = 1_796_000_000_000_000   # epoch µs


def dump_step(root: Path, iteration: int, start_us: int, kernels: int = 3) -> None:
    """The files MindSpore writes for one step: ``kernels`` outputs in ``rank_0/Net/0/<iteration>``."""
    folder = root / "rank_0" / "Net" / "0" / str(iteration)
    folder.mkdir(parents=True)
    for k in range(kernels):
        name = f"MatMul.Default_network-MatMul-op{k}.0.0.{start_us + 10 + k}.output.0.DefaultFormat.Float32.npy"
        (folder / name).write_bytes(b"x")


def left(root: Path) -> list:
    return sorted(int(p.name) for p in (root / "rank_0" / "Net" / "0").iterdir())


def test_the_steps_checked_clean_lose_their_dump_and_the_last_ones_stay(tmp_path):
    pruner = DumpPruner(tmp_path, 0, "Net")
    for step in range(10):
        start = T0 + step * 1000
        pruner.at_step(start, failed=False)   # the step begins: earlier steps ended with no failure recorded
        dump_step(tmp_path, step, start)       # ... and MindSpore dumps it as it runs
        assert len(left(tmp_path)) <= KEPT_BEHIND + 1, left(tmp_path)
    assert left(tmp_path) == [7, 8, 9] and pruner.removed_files == 7 * 3 and pruner.broken is None


def test_nothing_is_removed_once_a_failure_is_recorded(tmp_path):
    pruner = DumpPruner(tmp_path, 0, "Net")
    for step in range(4):
        pruner.at_step(T0 + step * 1000, failed=False)
        dump_step(tmp_path, step, T0 + step * 1000)
    pruner.at_step(T0 + 4000, failed=True)   # step 3 failed: its dump, and the ones before it, stay
    pruner.at_step(T0 + 5000, failed=True)
    assert left(tmp_path) == [1, 2, 3]


def test_files_of_another_step_in_the_same_iteration_folder_are_told_apart_by_time(tmp_path):
    """Two steps dumped into one iteration folder (graphs sharing a counter): only the older step's files go."""
    pruner = DumpPruner(tmp_path, 0, "Net")
    folder = tmp_path / "rank_0" / "Net" / "0" / "0"
    folder.mkdir(parents=True)
    for step in range(4):
        pruner.at_step(T0 + step * 1000, failed=False)
        (folder / f"Add.Default_Add-op0.0.0.{T0 + step * 1000 + 5}.output.0.DefaultFormat.Float32.npy").write_bytes(b"")
    stamps = sorted(int(p.name.split(".")[4]) - T0 for p in folder.iterdir())
    assert stamps == [1005, 2005, 3005], stamps


def test_a_file_that_cannot_be_removed_stops_pruning_and_says_so(tmp_path, capsys):
    pruner = DumpPruner(tmp_path, 0, "Net")
    for step in range(3):
        pruner.at_step(T0 + step * 1000, failed=False)
        dump_step(tmp_path, step, T0 + step * 1000)
    # a folder where a dump file's name is: unlink refuses it (EISDIR), whoever runs the test
    (tmp_path / "rank_0" / "Net" / "0" / "0" / f"Add.Default_Add-op9.0.0.{T0 + 1}.output.0.DefaultFormat.Float32.npy"
     ).mkdir()
    pruner.at_step(T0 + 3000, failed=False)   # never raises: the training goes on
    assert pruner.broken is not None and "cannot remove the dump" in capsys.readouterr().err
    pruner.at_step(T0 + 4000, failed=False)   # and it stops: the later steps' files stay
    assert left(tmp_path) == [0, 1, 2], left(tmp_path)
