"""The zoo corpus table: `mindguard hunt` on every family of tests/zoo/, each answer checked against the truth the
script states (its docstring; established by a plain run or by construction, not by mindguard), as a Markdown table.

    python tests/zoo/corpus.py [--out docs/zoo-corpus.md] [--only NAME ...] [--no-fix]

Per family: the exit code, the 1-based global step, the op (the origin, or the op a step that raised stopped in),
the line (the marker comment on the culprit's line; for a shared cell, the call site), words the hint must hold,
words the origin the answer traces to must hold (the batch column, row and value; the learning rate; the data file),
what the hunt's own check of the hint's edit said (``fix checked``: summary.json's ``fix_check``, not judged), and
-- where the script has ``--fix`` (the fix the hint prints) -- whether the fixed run is healthy. Each cell says
right or wrong with what was found. Runs one hunt at a time (about 10-40 s each on 2 CPU cores; 6 minutes in all).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

ZOO = Path(__file__).resolve().parent
REPO = ZOO.parent.parent


@dataclass
class Family:
    """One zoo family and its stated truth. ``step`` None: the step moves with MindSpore's numerics (not checked);
    ``ops``: acceptable op types (``"input"``: the batch itself is the origin); ``marker``: the culprit line's
    marker (None: not checked); ``fix``: extra arguments that apply the printed fix (None: no fix to check)."""

    name: str
    script: str
    args: Tuple[str, ...]
    shape: str
    exit: int
    step: Optional[int]
    ops: Tuple[str, ...]
    marker: Optional[str]
    hint: Tuple[str, ...] = ()
    fix: Optional[Tuple[str, ...]] = None
    call_site: bool = False
    data_dir: bool = False
    origin: Tuple[str, ...] = ()    # words the origin the answer traces to (its `= origin:` line) must hold
    extra: Dict[str, Any] = field(default_factory=dict)


FAMILIES: List[Family] = [
    Family("norm-per-epoch", "per_epoch_loop.py", ("--guard", "fresh"), "per-epoch model.train loop, nn.Norm",
           1, 10, ("SqrtGrad",), "# CULPRIT", ("SafeNorm",)),
    Family("oov-token", "per_epoch_loop.py", ("--bug", "oov"), "per-epoch loop, token id past the vocab",
           1, 7, ("Gather",), "# GATHER", ("index out of range",)),
    Family("kg-two-phase", "kg_two_phase.py", ("--guard", "shared", "--bad_phase", "head", "--bad_step", "5"),
           "TransE, two training phases, ops.norm in a helper", 1, 5, ("SqrtGrad",), "# CULPRIT",
           ("safe_norm(x, axis=2)",)),
    Family("kg-manual-loop", "kg_manual_loop.py", (), "KG, two train cells stepped by hand", 1, 33, ("Gather",),
           "# GATHER", ("max index 50 >= 50 rows",)),
    Family("shared-entity", "shared_embedding.py", (), "DistMult, one embedding called twice", 1, 6, ("Gather",),
           "# CULPRIT", ("ops.clip_by_value(ids, 0, 49)",), fix=("--fix",)),
    Family("ocr-ctc", "crnn_ctc.py", (), "CRNN + CTC loss, label longer than its input", 1, 5, ("CTCLoss",),
           "# CULPRIT", ("needs 10 time steps",), fix=("--fix",)),
    Family("eval-log-softmax", "train_with_eval.py", ("--style", "fit"), "Model.fit with validation",
           1, 10, ("Log",), "# CULPRIT", ("log_softmax",)),
    Family("loss-scale-nan-label", "loss_scale_step.py", (), "dynamic loss scale, overflow skipped, NaN label",
           1, 7, ("input",), None),
    Family("bn-lr-explode", "bn_explode.py", ("--arch", "convbn"), "conv+BN, exploding learning rate",
           1, None, ("BatchNorm",), "# CULPRIT", ("learning rate",)),
    Family("pynative-jit", "pynative_jit_cell.py", (), "PyNative with a @jit sub-cell", 1, 6, ("SqrtGrad",),
           "keepdims=True))  # CULPRIT", ("+ 1e-6)",)),
    Family("generator-raises", "generator_raises.py", (), "GeneratorDataset raising on a corrupt record",
           1, 6, ("dataset",), "# BUG: the corrupt record"),
    Family("plain-train-cell", "plain_train_cell.py", (), "PyNative plain Cell train step", 1, 4, ("Log",),
           "# CULPRIT", ("log_softmax",)),
    Family("bce-saturated", "bce_saturated.py", (), "hand-written BCE of a saturated sigmoid", 1, 4, ("Log",),
           "# CULPRIT", ("ops.log(1.0 - p + 1e-6)",)),
    Family("masked-attention", "masked_attention.py", ("--mode", "graph", "--jit", "--mask", "fill"),
           "attention over an all-padding sequence", 1, 4, ("Sub",), "# CULPRIT", ("-1e9",)),
    Family("amp-zero-std", "amp_input_norm.py", (), "AMP O2, input normalised by a zero std", 1, 5,
           ("Div", "RealDiv"), "# CULPRIT", ("epsilon",)),
    Family("grad-accumulation", "grad_accumulation.py", ("--mode", "pynative"),
           "gradient accumulation, NaN waiting in the buffers", 1, 4, ("SqrtGrad",), "# CULPRIT"),
    Family("gan-log-sigmoid", "gan_watch.py", ("--nan_step", "9"), "GAN container under watch", 1, 9, ("Log",),
           "# CULPRIT", ("ops.softplus(-out_real)",), fix=("--nan_step", "9", "--fix")),
    Family("torch-style-mean", "torch_style_watch.py", (), "torch-style model (mindnlp shape), masked mean",
           1, 5, ("Div", "RealDiv"), "# CULPRIT", ("maximum",), fix=("--fix",)),
    Family("recommender-ids", "wide_deep_ids.py", (), "Wide&Deep, hashed id past a 10,000-row table",
           1, 25, ("Gather",), "# CULPRIT", ("10007", "10000 rows"), fix=("--fix",),
           origin=("`batch_ids`", "row 3 of 8 holds 10007")),
    Family("recommender-raw-ids", "wide_deep_ids.py", ("--raw_ids",),
           "Wide&Deep, raw int32 ids: the raising Gather is the step's first kernel (nothing dumped)",
           1, 25, ("Gather",), "# RAISES FIRST: GRAPH, --raw_ids", ("10007", "10000 rows"),
           origin=("`batch_ids`", "row 3 of 8 holds 10007")),
    Family("detector-matches", "ssd_matched.py", (), "SSD loss / num_matched_boxes = 0", 1, 8, ("Div", "RealDiv"),
           "# CULPRIT", ("ops.maximum(num_matched_boxes, 1)",), fix=("--fix",)),
    Family("seq2seq-shared", "transformer_shared.py", (), "Transformer, shared embedding, loss scale", 1, 10,
           ("Gather",), "# CULPRIT", ("100 rows",), fix=("--fix",), call_site=True,
           origin=("`source_ids`", "row 2 of 4 holds 100")),
    Family("twin-shared-normaliser", "siamese_shared.py", (), "twin network, one L2Normalize cell for both sides",
           1, 5, ("SqrtGrad",), "# CULPRIT", ("+ 1e-6)",), fix=("--fix",), call_site=True),
    Family("corrupt-jpeg", "image_folder_corrupt.py", (), "ImageFolder classifier, a corrupt JPEG", 1, 6,
           ("dataset",), None, data_dir=True, origin=("dog/2.JPEG", "truncated JPEG")),
    Family("html-as-jpeg", "image_folder_corrupt.py", ("--corrupt", "html"),
           "ImageFolder classifier, an HTML page saved as .JPEG", 1, 6, ("dataset",), None, data_dir=True,
           origin=("dog/2.JPEG", "an HTML page")),
    Family("bert-mask-fp16", "bert_mask_fp16.py", (), "BERT-style fp16 fine-tune, a mask row of token ids", 1, 5,
           ("Mul",), "# CULPRIT", ("Fix the data first",), fix=("--fix",),
           origin=("`input_mask`", "row 2 of 4 holds 199")),
    Family("yolo-lr-exp", "yolo_box_lr.py", (), "YOLO-style box decode, lr schedule 30x after warm-up", 1, None,
           ("Exp",), "# CULPRIT", ("Fix the schedule first", "clamp x"), fix=("--fix",),
           origin=("learning rate", "jumped 30x")),
    Family("wgan-gp-watch", "wgan_gp.py", ("--wiring", "watch"),
           "WGAN-GP, norm of an input-gradient (double backward), watch on a GRAPH TrainOneStepCell", 1, 1,
           ("Pow",), "# CULPRIT", ("mindguard.safe_norm(gradients, axis=1)",), fix=("--fix",)),
    Family("wgan-gp-model", "wgan_gp.py", ("--wiring", "model"),
           "WGAN-GP, the same penalty under Model.train + Guard", 1, 1, ("Pow",), "# CULPRIT",
           ("mindguard.safe_norm(gradients, axis=1)",), fix=("--fix",)),
    Family("weight-nan-later", "param_nan_later.py", (),
           "MLP, a weight made NaN by a step whose loss a ReLU keeps finite, read by the next step (loss-only Guard)",
           1, 4, ("input",), None, ("Find the step that made `fc1.weight`",),
           origin=("`fc1.weight` held 128 NaN", "one of global steps 1-3")),
    Family("fp16-mask-fill", "attention_constants.py", (), "fp16 attention, a -1e9 mask fill", 1, 1, ("Mul",),
           "# FILL", ("Fix the constant first",), fix=("--fix",), origin=("constant -inf", "literal -1e9")),
    Family("zero-temperature", "attention_constants.py", ("--bug", "temperature"),
           "attention scores divided by a configured temperature of 0", 1, 1, ("Div",), "# SCALE",
           ("divides by the constant 0",), fix=("--bug", "temperature", "--fix"), origin=("constant 0", "divisor")),
]


def line_of(path: Path, marker: str) -> Optional[int]:
    """The first code line ending with ``marker`` (a comment) or containing it (code)."""
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        text = line.rstrip()
        if (marker.startswith("#") and text.endswith(marker) and text[: -len(marker)].strip()) or \
                (not marker.startswith("#") and marker in text):
            return number
    return None


def hunt(family: Family, workdir: Path, args: Sequence[str], name: str) -> Tuple[int, Dict[str, Any], float]:
    """``mindguard hunt`` on the family's script: ``(exit code, summary, seconds)``."""
    env = dict(os.environ, GLOG_v="3")
    env.pop("MINDSPORE_DUMP_CONFIG", None)
    extra = ("--data_dir", str(workdir / "data")) if family.data_dir else ()
    run = workdir / name
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "mindguard", "hunt", "--run-dir", str(run), "--",
                           sys.executable, str(ZOO / family.script), *args, *extra],
                          cwd=workdir, env=env, capture_output=True, text=True, timeout=900)
    seconds = time.monotonic() - start
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
    return proc.returncode, summary, seconds


def answer_of(summary: Dict[str, Any]) -> Dict[str, Any]:
    """Step, op, direction, line, hint and call site of a hunt's answer (the origin, else the op the step stopped
    in)."""
    failure = summary.get("failure") or {}
    origin = summary.get("origin")
    stopped = summary.get("stopped_at") or {}
    op = origin or stopped.get("op") or {}
    hint = (origin or {}).get("hint") or stopped.get("hint") or ""
    op_type = op.get("op_type")
    if origin and origin.get("direction") == "input" and op_type in (None, "", "input"):
        op_type = "input"
    sites = op.get("call_sites") or {}
    traced = (origin or {}).get("traced_to") or stopped.get("traced_to") or []
    return {"step": failure.get("global_step"), "op": op_type, "direction": op.get("direction"),
            "line": (op.get("source") or {}).get("line"), "call_line": sites.get("line"), "hint": hint,
            "origin": traced[0].get("text", "") if traced else ""}


def judge(family: Family, code: int, summary: Dict[str, Any]) -> Dict[str, Tuple[bool, str]]:
    """Each column: ``(right, what was found)``."""
    got = answer_of(summary)
    out: Dict[str, Tuple[bool, str]] = {"exit": (code == family.exit, str(code))}
    out["step"] = (True, f"{got['step']}, not checked: it moves with MindSpore's numerics") if family.step is None \
        else (got["step"] == family.step, str(got["step"]))
    out["op"] = (got["op"] in family.ops, str(got["op"]))
    if family.marker is None:
        out["line"] = (True, "-")
    else:
        want = line_of(ZOO / family.script, family.marker)
        found = got["call_line"] if family.call_site else got["line"]
        out["line"] = (found == want, f"{found}" + ("" if found == want else f" (want {want})"))
    missing = [w for w in family.hint if w not in got["hint"]]
    out["hint"] = (not missing, "ok" if not missing else f"missing {missing!r}")
    absent = [w for w in family.origin if w not in got["origin"]]
    if family.origin:
        out["origin"] = (not absent, "ok" if not absent else f"missing {absent!r} in {got['origin']!r}")
    else:
        out["origin"] = (True, "-")
    return out


def fix_checked(summary: Dict[str, Any]) -> str:
    """The hunt's own check of the hint's edit (summary.json's ``fix_check``), in a few words; ``-`` when no hint
    carried an edit to apply (not judged: what the check says)."""
    check = summary.get("fix_check")
    if not isinstance(check, dict):
        return "-"
    verdict, through = check.get("verdict"), check.get("through_step")
    if verdict == "trains_finite":
        return f"trains finite (through {through})"
    if verdict == "guard_only":
        return f"guard only (finite through {through}; the origin is still there)"
    if verdict == "still_fails":
        return "does not hold"
    why = str(check.get("why") or "")
    return f"unchecked ({why[:70]}{'...' if len(why) > 70 else ''})".replace("|", "/")


def table(rows: List[Dict[str, Any]]) -> str:
    """The Markdown table (one row per family) and a count of right answers."""
    def cell(value: Tuple[bool, str]) -> str:
        return ("right" if value[0] else "**wrong**") + (f" ({value[1]})" if value[1] not in ("ok", "-") else "")

    lines = ["| family | shape | exit | step | op | line | hint | origin | fix checked | fix trains finite | s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    right = 0
    for row in rows:
        v = row["verdict"]
        fix = "-" if row["fix"] is None else ("right" if row["fix"] else "**wrong**")
        ok = all(r for r, _ in v.values()) and row["fix"] is not False
        right += ok
        lines.append(f"| {row['name']} | {row['shape']} | {cell(v['exit'])} | {cell(v['step'])} | {cell(v['op'])} | "
                     f"{cell(v['line'])} | {cell(v['hint'])} | {cell(v['origin'])} | {row['checked']} | {fix} | "
                     f"{row['seconds']:.0f} |")
    return "\n".join(lines) + f"\n\n{right} of {len(rows)} families answered right in every column.\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="write the table here (default: print it)")
    parser.add_argument("--only", nargs="*", default=None, help="family names to run")
    parser.add_argument("--no-fix", action="store_true", help="do not hunt the fixed scripts")
    cfg = parser.parse_args(argv)
    families = [f for f in FAMILIES if not cfg.only or f.name in cfg.only]
    rows = []
    for family in families:
        with tempfile.TemporaryDirectory(prefix=f"zoo-{family.name}-") as tmp:
            code, summary, seconds = hunt(family, Path(tmp), family.args, "run")
            fixed = None
            if family.fix is not None and not cfg.no_fix:
                fix_code, fix_summary, fix_seconds = hunt(family, Path(tmp), family.fix, "fixed")
                fixed = fix_code == 0 and fix_summary.get("outcome") == "healthy"
                seconds += fix_seconds
        verdict = judge(family, code, summary)
        rows.append({"name": family.name, "shape": family.shape, "verdict": verdict, "fix": fixed,
                     "checked": fix_checked(summary), "seconds": seconds})
        print(f"{family.name}: " + ", ".join(f"{k} {'ok' if r else 'WRONG ' + v}" for k, (r, v) in verdict.items())
              + ("" if fixed is None else f", fix {'ok' if fixed else 'WRONG'}"), file=sys.stderr, flush=True)
    text = table(rows)
    if cfg.out:
        out = Path(cfg.out)
        header = out.read_text().split("<!-- table -->")[0] if out.exists() else ""
        part = out.with_name(out.name + ".part")
        part.write_text(header + "<!-- table -->\n" + text)
        os.replace(part, out)   # atomic: a reader sees the old table or the new one
    else:
        print(text)
    return 0 if all(all(r for r, _ in row["verdict"].values()) and row["fix"] is not False for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
