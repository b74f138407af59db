"""selection.txt: select's report as a table, one row per candidate with its figures and why it
won or lost, under a header saying how the candidates were measured.
"""

from __future__ import annotations

from typing import Any


def _more_rounds(race: dict[str, Any]) -> str:
    """What the header says of the rounds measured past ``rounds`` while a lead was undecided."""
    more = race["rounds_run"] - race["rounds"]
    return f" + {more} more while a lead was undecided ({race['seconds']:g} s in all)" if more > 0 else ""


def table(report: dict[str, Any]) -> str:
    """selection.txt: per candidate the figures judged, the threads it ran on ("all": the
    runtime's default, all cores), its worst verify cosine (of an output or part), and when
    measured together their spread (p10-p90), the benchmark's p50 beside them and how much
    faster the winner is."""
    from optbuild.model.timing import busy_note

    together = report["measure"] == "together"
    head = f"select by {report['objective']}"
    if race := report["race"]:
        load = race["load"]
        others = f", other processes {load['others_cpu']:.0%} of them" if load.get("others_cpu") is not None else ""
        head += (f", measured together: {race['runs']} runs each in {race['rounds']} rounds{_more_rounds(race)}, "
                 f"order rotating, load average {load['load_average']} on {load['cpu_count']} CPUs{others}")
    elif together:
        head += ", measured together: no candidate could be measured"
    else:
        head += ", by the benchmarks' figures"
    if report["constraints"]:
        head += f", constraints {report['constraints']}"
    # real models raced at load 4 on 2 CPUs: a 1.24x lead that measured 0.99x on a quiet host
    if race and (busy := busy_note(race["load"])) is not None:
        head += f"\nnote: {busy}; a lead measured so may not hold on a quiet host"
    if race and race["undecided"]:
        head += (f"\nnote: after {race['rounds_run']} rounds in {race['seconds']:g} s (max_seconds {race['max_seconds']:g})"
                 f" the lead over {', '.join(race['undecided'])} is still undecided: judged a tie; a larger max_seconds, "
                 "or a quieter host, may decide it")
    if report["tie"]:
        head += f"\ntie{' within the noise' if race else ''}, broken by {report['tie']['broken_by']}"
    columns = [("candidate", 32), ("p50 ms", 9)] + ([("p10-p90 ms", 17)] if together else []) + [
        ("thr/s", 9), ("threads", 7)] + ([("bench p50", 9), ("won by", 9)] if together else []) + [
        ("MiB", 7), ("cosine", 9)]
    lines = [head, " ".join(f"{name:{width}}" if i == 0 else f"{name:>{width}}"
                            for i, (name, width) in enumerate(columns)) + "  verdict"]
    for row in report["candidates"]:
        f, measured, verify = row["figures"], row["together"], row["verify"] or {}
        cosine = verify.get("cosine")
        cells = [f"{'*' if row['step'] == report['chosen'] else ' '}{row['step']}"]
        cells.append("-" if f is None else f"{f['p50_ms']:.3f}")
        if together:
            cells.append(f"{measured['p10_ms']:.3f}-{measured['p90_ms']:.3f}" if measured else "-")
        cells.append("-" if f is None else f"{f['throughput_per_s']:.1f}")
        cells.append("-" if row["benchmark"] is None else str(row["threads"] or "all"))
        if together:
            lead = row["winner_lead"]
            cells.append("-" if row["benchmark"] is None else f"{row['benchmark']['p50_ms']:.3f}")
            cells.append(f"{lead['ratio']:.2f}x" if lead else "-")
        cells.append("-" if row["benchmark"] is None else f"{row['benchmark']['size_bytes'] / (1 << 20):.2f}")
        cells.append("-" if cosine is None else f"{cosine:.6f}")
        verdict = "; ".join(row["rejected"]) if row["rejected"] else (row["why"] or "")
        lines.append(" ".join(f"{cell:{width}}" if i == 0 else f"{cell:>{width}}"
                              for i, (cell, (_, width)) in enumerate(zip(cells, columns, strict=True))) + "  " + verdict)
    if levels := [f"{row['step']} {row['together']['level']}" for row in report["candidates"]
                  if row["together"] and row["together"].get("level")]:
        lines.append(f"measured at onnxruntime graph optimization level: {', '.join(levels)}")
    lines += [f"note: {note}" for note in (race or {}).get("notes") or []]
    return "\n".join(lines)
