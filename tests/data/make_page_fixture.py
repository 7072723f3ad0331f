"""Regenerate ``page_demo.json``: the report page's data (``mindguard.report.pagedata.run_page_data``) of a real
``mindguard hunt`` of the demo (``mindguard.demos.norm_nan``, GRAPH mode), for ``tests/test_page.py``'s fast tests
of the page renderer (no MindSpore needed there).

    python tests/data/make_page_fixture.py       # ~15 s on CPU; rewrites tests/data/page_demo.json
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    from mindguard.report.pagedata import run_page_data

    with tempfile.TemporaryDirectory(prefix="mindguard_page_fixture_") as scratch:
        run = Path(scratch) / "run"
        env = dict(os.environ, GLOG_v="3")
        env.pop("MINDSPORE_DUMP_CONFIG", None)
        proc = subprocess.run([sys.executable, "-m", "mindguard", "hunt", "--run-dir", str(run), "--", sys.executable,
                               "-m", "mindguard.demos.norm_nan", "--epochs", "3"], env=env, capture_output=True,
                              text=True)
        if proc.returncode != 1:
            print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
            return 1
        data = run_page_data(run)
    text = json.dumps(data, indent=1, sort_keys=False)
    (HERE / "page_demo.json").write_text(text.replace(scratch, "/tmp/mindguard_page_fixture") + "\n")
    print(f"wrote {HERE / 'page_demo.json'} ({len(text)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
