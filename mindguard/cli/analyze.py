"""``mindguard analyze DUMP_DIR [--iteration N] [--rank R] [--json] [--plot out.png] [--html report.html]``.

Exit status: 0 when every tensor file of the iteration was read and it holds no Inf/NaN and ran to its end;
1 when it holds Inf/NaN or a step that raised stopped in it (the report says where); 2 when the dump cannot be
analysed, or only partly (bad path, iteration or rank; no readable tensor; some tensor files unusable -- the
message says which and what exists), or the ``--plot`` or ``--html`` file cannot be written (checked before the
analysis starts, and again when writing; ``--html`` refuses an existing file). Never a traceback: an unexpected error is
reported in one line, exit 2.
"""
from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path
from typing import Any, List, Optional, Union

from ..report.model import DumpReport
from ..analysis.report import analyze_dump


def cli_analyze(args: Any) -> int:
    """Handler for the ``analyze`` subcommand (argparse namespace: dump_dir, iteration, rank, state, json, plot)."""
    plot = getattr(args, "plot", None)
    page = getattr(args, "html", None)
    if page:
        problem = html_destination_problem(page)
        if problem:
            print(f"mindguard analyze: {problem}", file=sys.stderr)
            return 2
    if plot:
        try:   # before the analysis, which can take minutes on a big dump
            check_plot_destination(plot)
        except OSError as exc:
            print(f"mindguard analyze: cannot write plot {plot}: {_os_reason(exc, plot)}", file=sys.stderr)
            return 2
    try:
        report = analyze_dump(args.dump_dir, iteration=args.iteration, rank=args.rank,
                              state=getattr(args, "state", None))
    except (FileNotFoundError, ValueError) as exc:
        print(f"mindguard analyze: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:   # permission denied, a file where a directory should be, I/O error, ...
        print(f"mindguard analyze: cannot read dump {args.dump_dir}: {_os_reason(exc, args.dump_dir)}",
              file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - a damaged dump must not end in a traceback
        print(f"mindguard analyze: error: could not analyse {args.dump_dir}: {type(exc).__name__}: {exc} "
              f"(a mindguard bug or a dump it does not understand; please report it with this message)",
              file=sys.stderr)
        return 2
    try:
        if getattr(args, "json", False):
            print(json.dumps(report.to_dict(), indent=2, default=str))
        else:
            print(report)
        sys.stdout.flush()
    except BrokenPipeError:   # `mindguard analyze ... | head`: the reader left; not an error of the analysis
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if plot:
        try:
            path = save_plot(report, plot)
            print(f"mindguard analyze: plot written to {path}", file=sys.stderr)
        except ImportError:
            print("mindguard analyze: --plot needs matplotlib (pip install matplotlib); report printed without it",
                  file=sys.stderr)
        except OSError as exc:
            print(f"mindguard analyze: cannot write plot {plot}: {_os_reason(exc, plot)}", file=sys.stderr)
            return 2
    if page:
        written = write_html(page, report.to_dict(), "analyze")
        if written is None:
            return 2
    if report.holds_nonfinite:
        return 1
    return 0 if report.complete else 2


def check_plot_destination(path: Union[str, Path]) -> None:
    """Raise the ``OSError`` writing ``path`` would meet: it is a directory, or a parent is a regular file."""
    target = Path(path).expanduser()
    if target.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a directory; give a file name such as profile.png", str(target))
    for parent in target.parents:
        if parent.exists():
            if not parent.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(parent))
            return


def html_destination_problem(path: Union[str, Path]) -> str:
    """Why ``--html PATH`` is refused before any work ("" when it can be written): an existing file is never
    overwritten (a page of an earlier answer, or any file of the user's)."""
    target = Path(path).expanduser()
    if os.path.lexists(target):
        return (f"--html {path}: {target} already exists; mindguard never overwrites a file: remove it or give a "
                f"new name, e.g. --html {target.with_name(target.stem + '-2' + (target.suffix or '.html'))}")
    try:
        check_plot_destination(target)
    except OSError as exc:
        return f"--html {path}: cannot write there: {_os_reason(exc, path)}"
    return ""


def write_html(path: Union[str, Path], answer: Any, kind: str) -> Optional[Path]:
    """Write the page of ``answer`` (a DumpReport's or ReplayReport's dict) to ``path``; print where, or why not
    (then ``None``)."""
    from ..report.pagedata import replay_page_data, report_page_data, write_page

    problem = html_destination_problem(path)   # again: it may have appeared while the analysis ran
    if problem:
        print(f"mindguard {kind}: {problem}", file=sys.stderr)
        return None
    data = report_page_data(answer) if kind == "analyze" else replay_page_data(answer)
    try:
        written = write_page(Path(path).expanduser(), data)
    except OSError as exc:
        print(f"mindguard {kind}: cannot write --html {path}: {_os_reason(exc, path)}", file=sys.stderr)
        return None
    print(f"mindguard {kind}: report page written to {written}", file=sys.stderr)
    return written


def _os_reason(exc: OSError, path: Any) -> str:
    """``"Permission denied"``, plus the file it concerns when that is not ``path`` itself."""
    reason = exc.strerror or str(exc)
    if exc.filename is not None and str(exc.filename) != str(path):
        reason += f" ({exc.filename})"
    return reason


def save_plot(report: DumpReport, path: str) -> Path:
    """Largest finite |output| of each op along execution order (log scale), non-finite ops marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .._util.io import atomic_write_bytes

    profile: List[dict] = report.profile
    xs = [p["index"] for p in profile if p["absmax"]]
    ys = [p["absmax"] for p in profile if p["absmax"]]
    bad = [p["index"] for p in profile if p["nonfinite"]]
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.semilogy(xs, ys, ".-", label="largest finite |output|")
    for i, x in enumerate(bad):
        ax.axvline(x, color="red", alpha=0.3, label="non-finite output" if i == 0 else None)
    ax.axhline(65504, color="orange", linestyle="--", label="fp16 max")
    if report.origin:
        ax.set_title(f"origin: {report.origin['op_type']} ({report.origin['direction']}), "
                     f"iteration {report.iteration}")
    ax.set_xlabel("op launch (execution order)")
    ax.legend(loc="best")
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return atomic_write_bytes(path, buffer.getvalue())
