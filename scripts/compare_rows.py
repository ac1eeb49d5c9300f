#!/usr/bin/env python3
"""Joins the row benchmarks of kfuse (`rows.json`, from `benches/rows.rs`) and PyTorch
(`torch_rows.json`, from `scripts/bench_torch.py`) into one markdown table.

Per op and shape: each one's time, GB/s and fraction of the copy bandwidth it measured in
its own process, and kfuse / PyTorch as a speed ratio (PyTorch's time over kfuse's: above
1 means kfuse is faster). A row kfuse did not time (refused by the compiler, wrong result)
says why.

Usage: python3 scripts/compare_rows.py DIR   (reads DIR/rows.json and DIR/torch_rows.json,
writes DIR/rows_compare.md and prints it)
"""
import json
import os
import sys

LABELS = {"softmax": "softmax", "rms_norm": "RMSNorm (weight)", "layer_norm": "LayerNorm (weight, bias)", "sum": "sum (last axis)", "copy": "copy (reference)"}


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print(f"compare_rows: cannot read {path}: {e}", file=sys.stderr)
        return None


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("KFUSE_BENCH_OUT", ".")
    k, t = load(os.path.join(d, "rows.json")), load(os.path.join(d, "torch_rows.json"))
    if k is None and t is None:
        return 1
    k = k or {"rows": [], "device": "?", "copy_gbps": float("nan")}
    t = t or {"rows": [], "device": "?", "copy_gbps": float("nan"), "torch": "?"}
    tk = {(r["op"], r["M"], r["N"]): r for r in t["rows"]}
    keys = [(r["op"], r["M"], r["N"]) for r in k["rows"]]
    keys += [key for key in tk if key not in keys]
    kk = {(r["op"], r["M"], r["N"]): r for r in k["rows"]}

    lines = [
        f"device: {k.get('device', '?')}; PyTorch {t.get('torch', '?')}. Copy bandwidth (2^28 bf16 cuMemcpyDtoD / copy_): "
        f"kfuse run {k.get('copy_gbps', float('nan')):.0f} GB/s, PyTorch run {t.get('copy_gbps', float('nan')):.0f} GB/s.",
        "",
        "| op | M×N | kfuse ms | kfuse GB/s | kfuse of copy | PyTorch ms | PyTorch GB/s | PyTorch of copy | kfuse / PyTorch |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key in keys:
        op, m, n = key
        a, b = kk.get(key), tk.get(key)
        cells = [LABELS.get(op, op), f"{m}x{n}"]
        if a and a.get("status") == "ok":
            cells += [f"{a['ms']:.3f}", f"{a['gbps']:.0f}", f"{100 * a['fraction_of_copy']:.1f}%"]
        else:
            cells += ["—", "—", (a or {}).get("note", "not run").replace("|", "/")]
        if b and b.get("status") == "ok":
            cells += [f"{b['ms']:.3f}", f"{b['gbps']:.0f}", f"{100 * b['fraction_of_copy']:.1f}%"]
        else:
            cells += ["—", "—", (b or {}).get("note", "not run").replace("|", "/")]
        ok = a and b and a.get("status") == "ok" and b.get("status") == "ok"
        cells.append(f"{b['ms'] / a['ms']:.2f}×" if ok else "—")
        lines.append("| " + " | ".join(cells) + " |")
    md = "\n".join(lines) + "\n"
    with open(os.path.join(d, "rows_compare.md"), "w") as f:
        f.write(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
