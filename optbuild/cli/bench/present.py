"""A bench's results (``optbuild.app.bench``) as a plain or rich table, a plot, and JSON."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from optbuild.app.bench.results import BENCH_VERSION, BenchError, RecipeBench, ms
from optbuild.common.atomic import write_atomic
from optbuild.common.units import human_size

PLOT_FILE = "bench.png"  # beside bench.json, in build/<recipe>/

# --- presenting ------------------------------------------------------------------------------
COLUMNS = ("model", "step", "size", "p50 ms", "p90 ms", "p99 ms", "samples/s", "speed-up",
           "cosine", "max abs", "top-1", "verified by")


def table_rows(result: RecipeBench) -> list[list[str]]:
    """The table's cells, as text (COLUMNS)."""
    cells = []
    for row in result.rows:
        verify = row.verify[0] if row.verify else {}

        def fig(key: str, fmt: str, verify: dict[str, Any] = verify) -> str:
            value = verify.get(key)
            return format(value, fmt) if isinstance(value, (int, float)) else ""

        step = row.step.split(":", 1)[1]
        speedup = "" if row.speedup is None else f"{row.speedup:.2f}x"
        if row is result.baseline:
            speedup += " (base)"
        checked = ""
        if verify:
            checked = verify["step"].split(":", 1)[1] + ("" if verify.get("passed") else " FAILED")
            if len(row.verify) > 1:
                checked += f" (+{len(row.verify) - 1})"
        cells.append([
            row.label, step, "" if row.size_bytes is None else human_size(row.size_bytes),
            ms(row.latency_ms["p50"]), ms(row.latency_ms["p90"]), ms(row.latency_ms["p99"]),
            f"{row.throughput:,.0f}", speedup, fig("cosine", ".5f"), fig("max_abs", ".3g"),
            fig("top1", ".3f"), checked,
        ])
    return cells


def title(result: RecipeBench) -> str:
    s = result.settings
    threads = f"{s['threads']} thread{'s' if s['threads'] != 1 else ''}" if s["threads"] else "default threads"
    versions = ", ".join([*result.host.get("runtimes", []),
                          *([f"torch {result.host['torch']}"] if result.host.get("torch") else [])])
    return (f"{result.recipe}: batch {s['batch']}, {threads}, {s['runs']} timed runs after {s['warmup']} "
            f"warm-up ({versions}; {result.host.get('cpu') or result.host.get('arch')})")


def footer(result: RecipeBench) -> list[str]:
    lines = []
    if result.baseline is not None:
        lines.append(f"speed-up: p50 of {result.baseline.step} ({result.baseline.label}) / p50 of the row; "
                     "samples/s: batch / mean latency")
    refs = sorted({v["reference"] for row in result.rows for v in row.verify if v.get("reference")})
    if refs:
        lines.append(f"cosine, max abs, top-1: the verify step's report, candidate vs {', '.join(refs)}")
    lines += [f"note: {n}" for n in result.notes]
    if result.file is not None:
        lines.append(f"written: {result.file}" + (f", {result.plot_file}" if result.plot_file else ""))
    return lines


def plain_table(result: RecipeBench) -> str:
    cells = table_rows(result)
    right = {2, 3, 4, 5, 6, 7, 8, 9, 10}
    widths = [max(len(COLUMNS[i]), *(len(r[i]) for r in cells)) for i in range(len(COLUMNS))]

    def line(values: list[str] | tuple[str, ...]) -> str:
        return "  ".join(v.rjust(w) if i in right else v.ljust(w)
                         for i, (v, w) in enumerate(zip(values, widths))).rstrip()

    return "\n".join([title(result), line(COLUMNS), line(["-" * w for w in widths]),
                      *(line(r) for r in cells), *footer(result)])


def rich_table(result: RecipeBench) -> Any:  # rich.table.Table
    """The table for a terminal (title and footer are printed apart: see print_rich)."""
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for i, name in enumerate(COLUMNS):
        table.add_column(name, justify="left" if i in (0, 1, 11) else "right", no_wrap=True)
    for row, cells in zip(result.rows, table_rows(result)):
        table.add_row(*cells, style="bold" if row is result.baseline else None)
    return table


def print_rich(results: list[RecipeBench]) -> None:
    """Rich tables on stdout, never squeezed: a terminal narrower than a table wraps its lines."""
    from rich.console import Console
    from rich.measure import Measurement

    console = Console(highlight=False)
    terminal = console.width
    for i, result in enumerate(results):
        table = rich_table(result)
        natural = Measurement.get(console, console.options.update_width(10_000), table).maximum
        console.width = max(terminal, natural)
        if i:
            console.print()
        console.print(title(result), style="bold", markup=False)
        console.print(table)
        for line in footer(result):
            console.print(line, style="dim", markup=False)


def plot_module() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise BenchError("--plot needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot(result: RecipeBench, path: Path) -> None:
    """Horizontal bars per row: p50 latency, with p99 beside it."""
    plt = plot_module()
    labels = [f"{row.label}\n{row.step.split(':', 1)[1]}" for row in result.rows]
    p50 = [row.latency_ms["p50"] for row in result.rows]
    p99 = [row.latency_ms["p99"] for row in result.rows]
    positions = list(range(len(labels)))
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.6 * len(labels)))
    try:
        ax.barh([p - 0.2 for p in positions], p50, height=0.4, label="p50", color="#4c72b0")
        ax.barh([p + 0.2 for p in positions], p99, height=0.4, label="p99", color="#dd8452")
        for p, a, b in zip(positions, p50, p99):
            ax.text(a, p - 0.2, f" {ms(a)}", va="center", fontsize=8)
            ax.text(b, p + 0.2, f" {ms(b)}", va="center", fontsize=8)
        ax.set_yticks(positions, labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("latency (ms)")
        ax.set_title(title(result), fontsize=8, loc="left", wrap=True)
        ax.legend(loc="lower right")
        ax.set_xlim(0, max(p99) * 1.2)
        fig.tight_layout()
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=120)
        write_atomic(path, png.getbuffer())
    finally:
        plt.close(fig)


def write_plots(results: list[RecipeBench]) -> None:
    """Each recipe's plot beside its bench.json (``--plot``)."""
    for result in results:
        if result.file is not None:
            result.plot_file = result.file.parent / PLOT_FILE
            plot(result, result.plot_file)


def as_json(results: list[RecipeBench], root: Path) -> dict[str, Any]:
    return {"version": BENCH_VERSION,
            "recipes": [{**r.as_json(root), "file": str(r.file) if r.file else None,
                         "plot": str(r.plot_file) if r.plot_file else None} for r in results]}
