"""The quantization report: ``quantization.json``, a markdown table, and BENCHMARKS.md.

The markdown goes into BENCHMARKS.md between :data:`BEGIN` and :data:`END`
markers; everything outside them (other benchmarks' sections) is kept. A file
without the markers gets the section appended.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from facefuse.runtime.files import atomic_write_text
from facefuse.toolchain.reporting import section_markers, splice_section, write_section

SECTION = "quantization"
BEGIN, END = section_markers(SECTION)


def _mb(n: float | None) -> str:
    return "–" if n is None else f"{n / 1e6:.1f}"


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "–" if not a or not b else f"{a / b:.2f}×"


def _gate_text(task: str, fig: Mapping[str, Any]) -> str:
    if task == "embed":
        return (f"cos mean {fig['cos_mean']:.4f}, min {fig['cos_min']:.4f}; decisions agree "
                f"{fig['decision_agreement']:.2%} of {fig['pairs']} pairs")
    if task == "detect":
        kp = fig.get("kp_err_mean")
        return (f"{fig['faces_matched']}/{fig['faces_fp32']} faces at IoU≥0.9 "
                f"(min {fig['iou_min'] or 0:.3f}), {fig['faces_extra']} extra; keypoints "
                f"{'–' if kp is None else f'{kp:.2%}'} of width")
    if task in ("mesh", "iris"):
        return (f"landmark error mean {fig['err_mean']:.2%}, max {fig['err_max']:.2%} of IOD "
                f"({fig['faces']} inputs)")
    if task == "e2e":
        return (f"|Δ id_sim| max {fig['id_sim_abs_diff_max']:.4f} over {fig['pairs']} fused pairs")
    return json.dumps(fig)


def _row(name: str, m: Mapping[str, Any], label: str, v: Mapping[str, Any], fmt: str,
         cal: str, gate: str, fig: str) -> str:
    """One table row: a model variant's size, load cost, latencies and gate verdict."""
    lat = m.get("latency", {})
    lv = lat.get(label, {})
    size_x = "1.00×" if label == "fp32" else _ratio(m["fp32"]["size"], v.get("size"))
    speed_x = "1.00×" if label == "fp32" else _ratio(lat.get("fp32", {}).get("b8_t1"),
                                                     lv.get("b8_t1"))
    rss = m.get("load_rss", {}).get(label, {}).get("load")
    return (f"| {name} | {label} | {fmt} | {cal} | {_mb(v.get('size'))} | {size_x} | "
            f"{_mb(rss)} | {_ms(lv.get('b1_t1'))} | {_ms(lv.get('b1_t2'))} | "
            f"{_ms(lv.get('b8_t1'))} | {_ms(lv.get('b8_t2'))} | {speed_x} | {gate} | {fig} |")


def markdown(report: Mapping[str, Any]) -> str:
    """The report as markdown tables (what BENCHMARKS.md shows); long because it is
    the tables' layout, written out in order."""
    host = report["host"]
    lines = [
        "## Quantization (INT8 / FP16 behind the accuracy gate)",
        "",
        f"Command: `{report['command']}` — {report['created']}",
        "",
        f"Host: {host['cpu']} ({host['machine']}), {report.get('cores', '?')} cores; flags: "
        f"{', '.join(host['cpu_flags']) or 'unknown'}; int8 dot-product: "
        f"{'yes' if host['int8_dot_product'] else 'no'}; onnxruntime {host['onnxruntime']}, "
        f"onnx {host['onnx']}.",
        "",
        *([f"<details><summary><code>lscpu | head -20</code></summary>\n\n```\n"
           f"{report['machine'].rstrip()}\n```\n</details>", ""] if report.get("machine") else []),
        f"Data: {report['data']['disjointness']}",
        "",
        "| model | precision | format | calibration | size MB | ×smaller | load RSS MB | "
        "b1 ms 1t | b1 ms 2t | b8 ms/img 1t | b8 ms/img 2t | ×faster b8 1t | gate | figures |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in report["models"].items():
        lines.append(_row(name, m, "fp32", m["fp32"], "–", "–", "reference", ""))
        for label in ("int8", "fp16"):
            v = m.get(label)
            if not v:
                continue
            gate = "PASS" if v["passed"] else "**FAIL**"
            figs = _gate_text(m["task"], v["figures"]) if v.get("figures") else ""
            if not v["passed"]:
                figs += " — " + "; ".join(str(f) for f in v["failures"])
            elif v.get("kept") is False:
                gate = "PASS, not kept"
                figs += f" — {v.get('reason', '')}"
            fmt = str(v.get("format", "–")) + (" + FP32 heads" if v.get("fp32_nodes") else "")
            if v.get("provider"):
                fmt += f" (judged on {str(v['provider']).replace('ExecutionProvider', '')})"
            lines.append(_row(name, m, label, v, fmt, str(v.get("calibration", "–")), gate, figs))
    lines += ["", "<details><summary>Every INT8 candidate tried (latency at batch 8, "
              f"{report['settings']['threads']} thread(s), interleaved median, for the best "
              "candidate of each format)</summary>", "",
              "| model | format | calibration | FP32 nodes | ms/img b8 | gate | figures |",
              "|---|---|---|---|---|---|---|"]
    for name, m in report["models"].items():
        for c in m.get("candidates", []):
            figs = _gate_text(m["task"], c["figures"]) if c.get("figures") else c.get("error", "")
            chosen = " ✔" if c.get("chosen") else ""
            heads = ", ".join(c.get("fp32_nodes") or []) or "none"
            lines.append(f"| {name} | {c['format']}{chosen} | {c['calibration']} | {heads} | "
                         f"{_ms(c.get('latency_b8'))} | {'PASS' if c['passed'] else 'FAIL'} | "
                         f"{figs} |")
    lines += ["", "</details>"]
    e2e = report.get("e2e")
    if e2e:
        for label, g in e2e.items():
            fig = g["figures"]
            verdict = "PASS" if g["passed"] else "**FAIL**"
            lines += ["", f"End-to-end gate ({label}): {verdict} — {_gate_text('e2e', fig)}; "
                      f"pairs {', '.join(fig.get('pairs_fused', []))}; FP32 id_sim "
                      f"{fig['id_sim_fp32']}, quantized {fig['id_sim_quantized']}."]
    an = report.get("analysis")
    if an:
        lines += ["", "Whole analysis (decode → detect → mesh+iris → align → embed), median ms "
                  "per sample photo, FP32 vs the gated variants active under "
                  "`FACEFUSE_PRECISION=auto` on this CPU (INT8: "
                  f"{', '.join(report.get('analysis_int8_models', [])) or '–'}; the rest FP32):",
                  "",
                  "| threads | FP32 ms | INT8 ms | ×faster | FP32 detect/mesh/embed | "
                  "INT8 detect/mesh/embed |", "|---|---|---|---|---|---|"]
        for t, v in an.items():
            f, q = v["fp32"], v["int8"]

            def stages(d: Mapping[str, float]) -> str:
                return "/".join(f"{d.get(s, 0.0):.1f}" for s in ("detect", "mesh", "embed"))

            lines.append(f"| {t} | {f['total']:.1f} | {q['total']:.1f} | "
                         f"{_ratio(f['total'], q['total'])} | {stages(f)} | {stages(q)} |")
    load = (report.get("load_average_start"), report.get("load_average_end"))
    if load[0] is not None:
        lines += ["", f"Load average (1/5/15 min) at start {load[0]}, at end {load[1]}: other "
                  "processes share these cores, so timings (2 threads most of all) carry their "
                  "noise; every comparison is interleaved in the same run."]
    if report.get("notes"):
        lines += [""] + [f"- {n}" for n in report["notes"]]
    return "\n".join(lines) + "\n"


def splice(document: str, section: str) -> str:
    """``document`` with the quantization section replaced by ``section``."""
    return splice_section(document, SECTION, section)


def write_report(report: Mapping[str, Any], report_dir: Path,
                 benchmarks: Path | None = None, machine: str | None = None) -> list[Path]:
    """Write ``quantization.json`` and ``quantization.md`` into ``report_dir`` and,
    when ``benchmarks`` is given, the section of BENCHMARKS.md (created if missing,
    headed by ``machine``)."""
    written = []
    js = report_dir / "quantization.json"
    atomic_write_text(js, json.dumps(report, indent=2, default=str) + "\n")
    md = report_dir / "quantization.md"
    text = markdown(report)
    atomic_write_text(md, text)
    written += [js, md]
    if benchmarks is not None:
        new_doc = "# Benchmarks\n\n"
        if machine:
            new_doc += f"Machine (`lscpu | head -20`):\n\n```\n{machine.rstrip()}\n```\n\n"
        write_section(benchmarks, SECTION, text, new_document=new_doc)
        written.append(benchmarks)
    return written
