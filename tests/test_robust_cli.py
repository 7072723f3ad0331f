"""Bad input and odd files at every entry point outside the analysis package: no traceback, no hang, no false
"ok". Commands run as real ``python -m mindguard`` subprocesses with a timeout (a hang fails the test), on
real files and real FIFOs (``os.mkfifo``); exit 2 means "could not run / could not read"."""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mindguard.cli import build_parser
from mindguard.errors import ParamsMismatchError, RecordError
from mindguard.protocol.record import FailureRecord

TIMEOUT = 60   # seconds: every command here answers in about one; a blocked read would hit this


def mindguard(*args: str, cwd=None, timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    env = dict(os.environ, GLOG_v="3")
    env.pop("MINDSPORE_DUMP_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "mindguard", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=env)


def refused(proc: subprocess.CompletedProcess, command: str, *fragments: str) -> str:
    """Assert exit 2, no traceback, and a last stderr line ``mindguard <command>: error: ...`` holding every
    fragment; return that line."""
    shown = f"exit {proc.returncode}\n--- stdout ---\n{proc.stdout[-2000:]}\n--- stderr ---\n{proc.stderr[-3000:]}"
    assert proc.returncode == 2, shown
    assert "Traceback" not in proc.stderr, shown
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith(f"mindguard {command}: error: "), shown
    for fragment in fragments:
        assert fragment in line, f"{fragment!r} not in: {line}"
    return line


@pytest.fixture
def odd_files(tmp_path):
    """A directory of odd files: random bytes, deep JSON, a FIFO, a plain file to put paths under."""
    files = {"random": tmp_path / "random.bin", "deep": tmp_path / "deep.json", "fifo": tmp_path / "fifo",
             "plain": tmp_path / "plain", "exec_fifo": tmp_path / "exec_fifo"}
    files["random"].write_bytes(bytes(range(128, 256)) * 4)
    files["deep"].write_text("[" * 100000)
    os.mkfifo(files["fifo"])
    os.mkfifo(files["exec_fifo"])
    os.chmod(files["exec_fifo"], 0o755)
    files["plain"].write_text("not a directory")
    return files


# ------------------------------------------------------------------------------------------ mindguard record
def test_record_of_files_that_are_not_records(tmp_path, odd_files):
    long_name = tmp_path / ("r" * 300 + ".json")
    big_int = tmp_path / "big.json"
    big_int.write_text('{"schema": 2, "status": "failed", "global_step": 1' + "0" * 5000 + "}")
    for path, fragment in [(odd_files["random"], "not UTF-8"), (odd_files["deep"], "nested too deeply"),
                           (odd_files["fifo"], "not a regular file"), (tmp_path, "not a regular file"),
                           (big_int, r"4300"), (long_name, "File name too long"),
                           (odd_files["plain"] / "x.json", "Not a directory"),
                           (tmp_path / "missing.json", "does not exist")]:
        refused(mindguard("record", str(path)), "record", fragment)


@pytest.mark.parametrize("fields,fragment", [
    ({"global_step": -3}, "global_step must be >= 0"), ({"epoch": -1}, "epoch must be >= 0"),
    ({"dump_iteration": -1}, "dump_iteration must be >= 0"), ({"sink_size": -7}, "sink_size must be -1"),
    ({"iteration_range": [-5, 3]}, "iteration_range must be null or [first, last] with 0 <= first <= last"),
    ({"iteration_range": [7, 3]}, "0 <= first <= last"), ({"step_window_us": [-1, 5]}, "microseconds >= 0"),
    ({"schema": 99}, "schema"), ({"global_step": True}, "global_step must be an integer"),
])
def test_record_fields_that_cannot_be_a_step_are_refused(tmp_path, fields, fragment):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"schema": 2, "status": "failed", "kind": "nonfinite_loss", **fields}))
    refused(mindguard("record", str(path)), "record", fragment)
    with pytest.raises(RecordError):
        FailureRecord.load(path)


def test_record_never_sends_terminal_escapes(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"schema": 2, "status": "failed", "kind": "exception", "global_step": 3, "epoch": 1,
                                "step_in_epoch": 3, "message": "\x1b[31mred\x1b[0m\rover\u202e",
                                "call": {"index": 2, "network": "\x1b[2JNet", "kind": "train"},
                                "nonfinite": ["\x1b[1mw"]}))
    for args in (["record", str(path)], ["record", str(path), "--json"]):
        proc = mindguard(*args)
        assert proc.returncode == 0, proc.stderr
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f\u202e]", proc.stdout), repr(proc.stdout)
    proc = mindguard("record", str(path))
    assert "training call 2 (\\x1b[2JNet)" in proc.stdout and "\\x1b[31mred\\x1b[0m\\rover\\u202e" in proc.stdout


def test_a_locator_asked_to_replace_a_file_that_is_not_a_record_refuses_without_blocking(run_py, tmp_path,
                                                                                         odd_files):
    """FailureLocator checks an existing record file before replacing it: random bytes and a FIFO are
    refused (ArgumentError, nothing overwritten), never decoded into a traceback or read forever."""
    proc = run_py(f"""
        import json
        import mindguard
        from mindguard.errors import ArgumentError
        from mindguard.training.run import _check_replaceable
        from pathlib import Path
        out = {{}}
        for name in ("random", "deep", "fifo"):
            try:
                _check_replaceable(Path({str(tmp_path)!r}) / {{"random": "random.bin", "deep": "deep.json",
                                                                 "fifo": "fifo"}}[name])
                out[name] = "accepted"
            except ArgumentError as exc:
                out[name] = str(exc)
        print("RESULT " + json.dumps(out))
        """, timeout=TIMEOUT)
    out = json.loads(proc.stdout.split("RESULT ", 1)[1])
    assert "not UTF-8" in out["random"] and "will not overwrite" in out["random"], out
    assert "nested too deeply" in out["deep"], out
    assert "not a regular file" in out["fifo"], out
    assert odd_files["random"].read_bytes() == bytes(range(128, 256)) * 4


# ------------------------------------------------------------------------------------------ mindguard dump-config
def test_dump_config_refuses_what_mindspore_would_not_dump(tmp_path, odd_files):
    base = ["dump-config", "--device-target", "CPU", "-o", str(tmp_path / "d.json")]
    cases = [
        (["--path", str(tmp_path / "d"), "--iteration", "\u00b2"], "ASCII digits"),
        (["--path", str(tmp_path / "d"), "--iteration", "\uff13"], "ASCII digits"),
        (["--path", str(tmp_path / "d"), "--iteration", "18446744073709551616"], "above 2**64 - 1"),
        (["--path", str(tmp_path / "d"), "--iteration", "4294967296"], "32 bits"),
        (["--path", str(tmp_path / ("a" * 300)), "--iteration", "1"], "at most 255"),
        (["--path", str(odd_files["plain"] / "d"), "--iteration", "1"], "is a file, not a directory"),
        (["--path", str(tmp_path / "d"), "--iteration", "1", "--net-name", "N" * 256], "File name too long"),
        (["--path", str(tmp_path / "d"), "--iteration", "1", "--input-output", "\uff11"], "ASCII digits"),
        (["--path", str(tmp_path / "d"), "--iteration", "1", "--op-debug-mode", "9"], "between 0 and 4"),
    ]
    for args, fragment in cases:
        refused(mindguard(*base, *args), "dump-config", fragment)
    assert not (tmp_path / "d.json").exists()


def test_dump_config_refuses_a_cell_name_as_kernel(tmp_path):
    refused(mindguard("dump-config", "--device-target", "CPU", "--path", str(tmp_path / "d"), "--iteration", "1",
                      "--kernels", "Dense", "-o", str(tmp_path / "d.json")),
            "dump-config", "names the cell mindspore.nn.Dense", "MatMul")


def test_dump_config_output_must_be_a_writable_regular_file(tmp_path, odd_files):
    common = ["dump-config", "--device-target", "CPU", "--path", str(tmp_path / "d"), "--iteration", "1", "-o"]
    for output, fragment in [(odd_files["plain"] / "d.json", "is a file, not a directory"),
                             (odd_files["fifo"], "not a regular file"), (tmp_path, "is a directory"),
                             (tmp_path / ("o" * 300 + ".json"), "at most 255")]:
        refused(mindguard(*common, str(output)), "dump-config", fragment)   # the FIFO: refused, not read


def test_dump_config_writes_the_iterations_mindspore_reads(tmp_path):
    proc = mindguard("dump-config", "--device-target", "CPU", "--path", str(tmp_path / "d"), "--iteration", "|1||3-3|",
                     "-o", str(tmp_path / "d.json"))
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "d.json").read_text())["common_dump_settings"]["iteration"] == "1|3"


# ------------------------------------------------------------------------------------------ mindguard hunt
def test_hunt_refuses_what_it_cannot_run_before_creating_anything(tmp_path, odd_files):
    (tmp_path / "script.py").write_text("print('x')\n")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    py = sys.executable
    cases = [
        (["--", "no-such-cmd-mindguard"], "no such file or command"),
        (["--", str(tmp_path)], "it is a directory"),
        (["--", str(tmp_path / "script.py")], "it is not executable", "python"),
        (["--", str(odd_files["exec_fifo"])], "not a regular file"),
        (["--run-dir", str(odd_files["plain"]), "--", py, "-c", "pass"], "is a file"),
        (["--run-dir", str(odd_files["plain"] / "sub"), "--", py, "-c", "pass"], "is a file, not a directory"),
        (["--run-dir", str(tmp_path / ("r" * 300)), "--", py, "-c", "pass"], "at most 255"),
        (["--net-name", "bad name", "--", py, "-c", "pass"], "--net-name", "letters, digits"),
        (["--net-name", "N" * 256, "--", py, "-c", "pass"], "File name too long"),
        (["--timeout", "inf", "--", py, "-c", "pass"], "positive, finite"),
        (["--timeout", "nan", "--", py, "-c", "pass"], "positive, finite"),
        (["--timeout", "\uff11", "--", py, "-c", "pass"], "positive, finite"),
        (["--timeout", "0", "--", py, "-c", "pass"], "positive, finite"),
    ]
    for case in cases:
        args, fragments = case[0], case[1:]
        refused(mindguard("hunt", *args, cwd=cwd), "hunt", *fragments)
    assert list(cwd.iterdir()) == [], "a refused hunt created a run folder"


# ------------------------------------------------------------------------------------------ mindguard iteration
def reference_count(text: str, minimum: int, maximum=None):
    """The rule for every count option: ASCII decimal digits (an optional '-'), within [minimum, maximum]."""
    if not re.fullmatch(r"-?[0-9]+", text) or len(text.lstrip("-").lstrip("0")) > 20:
        return None
    value = int(text)
    return value if value >= minimum and (maximum is None or value <= maximum) else None


def parse_or_none(argv):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            return build_parser().parse_args(argv), err.getvalue()
        except SystemExit as exc:
            assert exc.code == 2
            return None, err.getvalue()


counts = st.one_of(st.integers(-3, 10 ** 21).map(str),
                   st.text(alphabet="0123456789-+ _.e\u00b2\uff13\u0663", max_size=8),
                   st.sampled_from(["", "0", "00", "1_0", " 1", "1 ", "+1", "١", "1e3", "4294967295", "4294967296"]))


@settings(max_examples=400, deadline=None)
@given(epoch=counts, step=counts, initial=counts)
def test_iteration_arguments_are_ascii_counts_in_range(epoch, step, initial):
    argv = ["iteration", "--epoch", epoch, "--step", step, "--steps-per-epoch", "10", "--initial-iteration", initial]
    args, err = parse_or_none(argv)
    expected = (reference_count(epoch, 1), reference_count(step, 1), reference_count(initial, 0, 2 ** 32 - 1))
    if None in expected:
        assert args is None, (argv, vars(args) if args else None)
        assert err.count("\n") == 1 and err.startswith("mindguard iteration: error: argument --"), err
    else:
        assert args is not None, (argv, err)
        assert (args.epoch, args.step, args.initial_iteration) == expected


def test_iteration_command_exit_codes():
    proc = mindguard("iteration", "--epoch", "3", "--step", "50", "--steps-per-epoch", "100")
    assert proc.returncode == 0 and proc.stdout.startswith("dump iteration 249\n"), proc
    refused(mindguard("iteration", "--epoch", "\uff13", "--step", "1", "--steps-per-epoch", "3"), "iteration",
            "ASCII digits")
    refused(mindguard("iteration", "--epoch", "\u00b2", "--step", "1", "--steps-per-epoch", "3"), "iteration",
            "ASCII digits")
    refused(mindguard("iteration", "--epoch", "99999999999", "--step", "1", "--steps-per-epoch", "99999999"),
            "iteration", "32 bits")
    refused(mindguard("iteration", "--epoch", "1", "--step", "9", "--steps-per-epoch", "8"), "iteration",
            "between 1 and steps_per_epoch")


# ------------------------------------------------------------------------------------------ load_params
@pytest.fixture
def saved(tmp_path):
    import mindspore as ms
    from mindspore import nn

    import mindguard

    net = nn.Dense(3, 2)
    ms.set_context(device_target="CPU")
    mindguard.save_params(net, tmp_path / "p")
    return net, tmp_path / "p"


def _manifest(directory: Path) -> dict:
    return json.loads((directory / "manifest.json").read_text())


def _rewrite(directory: Path, manifest: dict) -> None:
    (directory / "manifest.json").write_text(json.dumps(manifest))


def test_load_params_refuses_a_fifo_parameter_file_without_blocking(saved, run_py):
    net, directory = saved
    entry = _manifest(directory)["parameters"][0]
    (directory / entry["file"]).unlink()
    os.mkfifo(directory / entry["file"])
    proc = run_py(f"""
        import mindspore as ms
        from mindspore import nn
        import mindguard
        from mindguard.errors import ParamsMismatchError
        try:
            mindguard.load_params(nn.Dense(3, 2), {str(directory)!r})
        except ParamsMismatchError as exc:
            print("REFUSED", exc)
        """, timeout=TIMEOUT)
    assert "REFUSED" in proc.stdout and "not a regular file" in proc.stdout, proc.stdout
    assert entry["name"] in proc.stdout, proc.stdout


def test_load_params_refuses_a_fifo_manifest_without_blocking(saved, run_py):
    net, directory = saved
    (directory / "manifest.json").unlink()
    os.mkfifo(directory / "manifest.json")
    proc = run_py(f"""
        from mindspore import nn
        import mindguard
        from mindguard.errors import ParamsMismatchError
        for call in (mindguard.load_params, mindguard.save_params):
            try:
                call(nn.Dense(3, 2), {str(directory)!r})
            except ParamsMismatchError as exc:
                print("REFUSED", exc)
        """, timeout=TIMEOUT)
    assert proc.stdout.count("REFUSED") == 2 and "not a regular file" in proc.stdout, proc.stdout


def test_load_params_refuses_a_pickle_with_a_matching_checksum(saved):
    import hashlib

    import mindguard

    net, directory = saved
    manifest = _manifest(directory)
    entry = manifest["parameters"][0]
    buffer = io.BytesIO()
    np.save(buffer, np.array([{"x": 1}], dtype=object), allow_pickle=True)
    (directory / entry["file"]).write_bytes(buffer.getvalue())
    entry["sha256"] = hashlib.sha256(buffer.getvalue()).hexdigest()
    _rewrite(directory, manifest)
    with pytest.raises(ParamsMismatchError) as info:
        mindguard.load_params(net, directory)
    text = str(info.value)
    assert entry["file"] in text and repr(entry["name"]) in text and "never unpickles" in text, text


@pytest.mark.parametrize("edit,fragment", [
    (lambda m: m.update(schema=99), "schema 99"),
    (lambda m: m["parameters"].append(dict(m["parameters"][0])), "more than once"),
    (lambda m: m["parameters"][0].update(shape=[-2, 3]), "not a mindguard parameter manifest"),
    (lambda m: m["parameters"][0].update(shape=[True, 3]), "not a mindguard parameter manifest"),
])
def test_load_params_checks_the_manifest(saved, edit, fragment):
    import mindguard

    net, directory = saved
    manifest = _manifest(directory)
    edit(manifest)
    _rewrite(directory, manifest)
    with pytest.raises(ParamsMismatchError, match=re.escape(fragment)):
        mindguard.load_params(net, directory)


def test_load_params_refuses_damaged_manifests(saved):
    import mindguard

    net, directory = saved
    for content, fragment in [(b"\xff\xfe", "UnicodeDecodeError"), (b"[" * 100000, "RecursionError"),
                              (b'{"format": "mindguard-params", "schema": 1' + b"0" * 5000 + b"}", r"4300")]:
        (directory / "manifest.json").write_bytes(content)
        with pytest.raises(ParamsMismatchError, match=fragment):
            mindguard.load_params(net, directory)


def test_load_params_still_round_trips(saved):
    import mindguard

    net, directory = saved
    assert mindguard.load_params(net, directory) == [p.name for p in net.get_parameters()]


def test_json_and_npy_readers_refuse_fifos_without_blocking(run_py, tmp_path):
    """Every JSON file mindguard reads (summaries, captures, records) and every .npy goes through _io: a FIFO
    there is an OSError at once, a damaged document a ValueError."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "deep.json").write_text("[" * 100000)
    proc = run_py(f"""
        from mindguard._util.io import load_npy, read_json
        for call, path in ((read_json, {str(fifo)!r}), (load_npy, {str(fifo)!r}),
                           (read_json, {str(tmp_path / "deep.json")!r})):
            try:
                call(path)
                print("READ", path)
            except (OSError, ValueError) as exc:
                print("REFUSED", "OSError" if isinstance(exc, OSError) else "ValueError", type(exc).__name__, exc)
        """, timeout=TIMEOUT)
    lines = proc.stdout.splitlines()
    assert [line.split()[:3] for line in lines] == [["REFUSED", "OSError", "NotRegularFileError"],
                                                   ["REFUSED", "OSError", "NotRegularFileError"],
                                                   ["REFUSED", "ValueError", "ArgumentError"]], proc.stdout
    assert "not a regular file" in lines[0] and "nested too deeply" in lines[2], proc.stdout
