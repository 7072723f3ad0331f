"""`mindguard analyze` on damaged copies of one real CPU dump: never "ok" with exit 0 on a dump it could not
analyse, never a traceback, never a hang. Exit codes: 0 analysed and clean, 1 found, 2 could not analyse.

The dump is made once per module by a real training (log of a zero row: the origin is Log, forward). Each
test damages its own copy. The CLI runs in a subprocess with a timeout, so a hang fails the test.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mindguard
from mindguard.analysis.stats import tensor_stats
from test_analysis_support import DUMP_PRELUDE, LOG_NET, train_dumps, writable_copy

SCRIPT = DUMP_PRELUDE + LOG_NET + '''

net = LogNet()
x = np.array([[1, 1, 1], [0, 0, 0], [2, 2, 2]], np.float32)
data = ds.NumpySlicesDataset((x, np.ones((3, 1), np.float32)), column_names=["x", "y"], shuffle=False).batch(3)
Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.01)).train(1, data, dataset_sink_mode=False)
'''


@pytest.fixture(scope="module")
def real_dump():
    for dumps in train_dumps("mindguard_damaged_", {"log": (SCRIPT, ["0"])}):
        yield dumps["log"][0]


@pytest.fixture
def dump(real_dump, tmp_path):
    """A writable copy of the real dump."""
    return writable_copy(real_dump, tmp_path / "dump")


def _analyze(path: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "mindguard", "analyze", str(path), *args], capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ, GLOG_v="3"))
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    return proc


def _iteration_dir(dump: Path) -> Path:
    return dump / "rank_0" / "Net" / "0" / "0"


def _file(dump: Path, prefix: str, io: str = "output") -> Path:
    return next(p for p in sorted(_iteration_dir(dump).iterdir()) if p.name.startswith(prefix + ".")
                and f".{io}.0." in p.name)


def test_the_undamaged_copy_names_log(dump):
    proc = _analyze(dump)
    assert proc.returncode == 1 and "error: Log (forward)" in proc.stdout, proc.stdout + proc.stderr
    assert "warning:" not in proc.stdout, proc.stdout              # no false alarm from the checks below


def test_a_dump_mindspore_failed_to_write(dump):
    for entry in (dump / "rank_0").iterdir():
        if entry.name != ".dump_metadata":
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    proc = _analyze(dump)
    assert proc.returncode == 2 and "ok:" not in proc.stdout, proc.stdout + proc.stderr
    assert "could not analyse" in proc.stdout and "no <net>/<graph>/<iteration> directories" in proc.stdout, proc.stdout


@pytest.mark.parametrize("victim", ["rank_0", "rank_0/Net"])
def test_a_layout_directory_that_is_a_regular_file(dump, victim):
    shutil.rmtree(dump / victim)
    (dump / victim).write_text("not a directory\n")
    proc = _analyze(dump)
    assert proc.returncode == 2 and "ok:" not in proc.stdout, proc.stdout + proc.stderr
    said = "rank_0: not a directory" if victim == "rank_0" else "no <net>/<graph>/<iteration> directories"
    assert said in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def _pickled(path: Path) -> None:
    with open(path, "wb") as handle:
        np.lib.format.write_array(handle, np.array([{"a": 1}], dtype=object), allow_pickle=True)


@pytest.mark.parametrize("damage", ["deleted", "empty", "pickled"])
def test_every_tensor_file_unusable_is_not_a_clean_dump(dump, damage):
    for npy in _iteration_dir(dump).glob("*.npy"):
        if damage == "deleted":
            npy.unlink()
        elif damage == "empty":
            npy.write_bytes(b"")
        else:
            _pickled(npy)
    proc = _analyze(dump)
    assert proc.returncode == 2 and "ok:" not in proc.stdout, proc.stdout + proc.stderr
    assert "could not analyse" in proc.stdout, proc.stdout
    if damage != "deleted":
        assert "unreadable tensor file" in proc.stdout, proc.stdout       # each file said, never unpickled


def test_a_directory_symlink_is_not_an_iteration(dump):
    (dump / "rank_0" / "Net" / "0" / "9").symlink_to("../..")
    report = mindguard.analyze_dump(dump, progress=False)
    assert report.iteration == 0 and report.iterations == [0], (report.iteration, report.iterations)
    assert report.origin["op_type"] == "Log", str(report)
    assert any("skipped directory symlink" in w and "/9" in w for w in report.warnings), report.warnings
    proc = _analyze(dump, "--iteration", "9")
    assert proc.returncode == 2 and "iteration=9: not dumped" in proc.stderr, proc.stdout + proc.stderr


def test_the_failing_ops_output_deleted_gives_a_warning_with_the_answer(dump):
    _file(dump, "Log").unlink()
    proc = _analyze(dump)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    warning = next((ln for ln in proc.stdout.splitlines() if ln.startswith("warning: Log (")), None)
    assert warning and "output file is missing" in warning and "Log is the origin" in warning, proc.stdout
    assert "already in the step's inputs" not in proc.stdout, proc.stdout     # not a silent wrong answer


@pytest.mark.parametrize("header", ["<f2", "<i4", "struct", ">f4"])
def test_a_header_dtype_contradicting_the_file_name_is_not_used(dump, header):
    victim = _file(dump, "Log", io="input")
    assert victim.name.endswith(".Float32.npy"), victim.name
    values = np.array([[3.0], [0.0], [6.0]])
    if header == "struct":
        array = np.zeros(3, dtype=[("a", "<f4"), ("b", "<i4")])
    else:
        array = values.astype(header)
    np.save(victim, array)
    report = mindguard.analyze_dump(dump, progress=False)
    warning = next((w for w in report.warnings if victim.name in w), "")
    assert "not used" in warning and "header dtype" in warning, report.warnings
    assert report.origin["op_type"] == "Log", str(report)
    assert report.origin["inputs"][0].get("unreadable"), report.origin["inputs"][0]   # not read as that dtype
    proc = _analyze(dump)
    assert proc.returncode == 1 and f"tensor file {victim.name} not used" in proc.stdout, proc.stdout


def test_random_bytes_in_the_execution_order_csv(dump):
    csv = dump / "rank_0" / "execution_order" / "ms_execution_order_graph_0.csv"
    csv.write_bytes(os.urandom(4096))
    proc = _analyze(dump)
    assert proc.returncode == 1 and "Log (forward)" in proc.stdout, proc.stdout + proc.stderr
    assert f"warning: {csv} is damaged" in proc.stdout, proc.stdout


def test_a_complex64_tensor_file(dump):
    victim = _file(dump, "MatMul")
    target = victim.with_name(victim.name.replace(".Float32.npy", ".Complex64.npy"))
    victim.unlink()
    np.save(target, np.array([[1 + 2j], [np.inf + 0j], [3j]], np.complex64))
    proc = _analyze(dump)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    stats = tensor_stats(np.array([1 + 2j, np.inf, np.nan, 0], np.complex64))
    assert (stats["nan"], stats["pos_inf"], stats["zeros"], stats["of"]) == (1, 1, 1, "abs"), stats
    assert stats["max"] == pytest.approx(np.sqrt(5), rel=1e-6) and stats["min"] == 0.0, stats
    report = mindguard.analyze_dump(dump, progress=False)
    matmul = [o for o in report.origin["outputs"] if o.get("dtype") == "complex64"] if report.origin else []
    assert report.origin["op_type"] == "MatMul" and matmul and matmul[0]["pos_inf"] == 1, str(report)


@pytest.mark.parametrize("where", ["tensor", "csv", "metadata"])
def test_a_fifo_is_skipped_never_opened(dump, where):
    if where == "tensor":
        fifo = _iteration_dir(dump) / "Add.Default_fifo-Add-op9.0.0.1.output.0.DefaultFormat.Float32.npy"
    elif where == "csv":
        fifo = dump / "rank_0" / "execution_order" / "ms_execution_order_graph_0.csv"
        fifo.unlink()
    else:
        fifo = dump / "rank_0" / ".dump_metadata" / "data_dump.json"
        if fifo.exists():
            fifo.unlink()
    os.mkfifo(fifo)
    proc = _analyze(dump, timeout=60)                 # a blocking open of the FIFO would hang here
    assert proc.returncode == 1 and "Log (forward)" in proc.stdout, proc.stdout + proc.stderr
    if where == "tensor":
        assert "not regular files" in proc.stdout and fifo.name in proc.stdout, proc.stdout
    elif where == "csv":
        assert "not a regular file" in proc.stdout, proc.stdout


MEMORY_CHILD = '''
import resource, sys, tracemalloc
import mindguard
tracemalloc.start()
report = mindguard.analyze_dump(sys.argv[1], progress=False)
current, peak = tracemalloc.get_traced_memory()
print(report.origin["op_type"] if report.origin else None, peak, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
'''


def test_statistics_of_a_200_mb_tensor_use_bounded_memory(dump, tmp_path):
    victim = _file(dump, "MatMul")                     # before the origin: read with full statistics
    victim.unlink()
    big = np.lib.format.open_memmap(victim, mode="w+", dtype=np.float32, shape=(50_000_000,))   # 200 MB
    big[::1000] = 1.5
    big[7] = -2.0
    del big
    script = tmp_path / "measure.py"
    script.write_text(MEMORY_CHILD)
    proc = subprocess.run([sys.executable, str(script), str(dump)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    op, peak, maxrss_kb = proc.stdout.split()
    assert op == "Log", proc.stdout
    print(f"tracemalloc peak {int(peak) / 1e6:.1f} MB, max RSS {int(maxrss_kb) / 1e3:.0f} MB (file: 200 MB)")
    assert int(peak) < 40e6, f"peak traced allocation {int(peak) / 1e6:.1f} MB for a 200 MB tensor"
