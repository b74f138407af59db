"""The page of ``optbuild report``: one self-contained HTML file (inline CSS, inline SVG, no
script, nothing fetched), drawn from an optbuild.app.report.Report.

Every string that comes from a recipe or a file the build wrote passes through ``_e``
(html.escape): a step, an output of a model or a runtime's label may hold any character.
"""

from __future__ import annotations

import html
import math
import time
from typing import Any

from optbuild import __version__
from optbuild.app.report import Deployment, Report, Selection, Variant, Verify

KEY_SHOWN = 16  # hex digits of a key on the page; the whole key is its tooltip

_CSS = """
body { font: 13.5px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d232b;
       background: #f6f7f9; margin: 0; padding: 24px 32px 48px; }
h1 { font-size: 24px; margin: 0 0 4px; } h2 { font-size: 19px; margin: 0 0 8px; }
h3 { font-size: 15px; margin: 18px 0 6px; color: #3a4350; }
.meta { color: #5b6470; margin: 0 0 16px; }
section { background: #fff; border: 1px solid #dde1e6; border-radius: 8px; padding: 18px 22px; margin: 18px 0; }
table { border-collapse: collapse; width: 100%; margin: 4px 0; }
th, td { text-align: left; padding: 4px 7px; border-bottom: 1px solid #e7eaee; vertical-align: top; }
th { font-weight: 600; color: #3a4350; background: #f1f3f6; }
td.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
code { font: 12.5px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
tr.chosen td { background: #e8f5e9; } tr.rejected td { color: #80868e; } td small { color: #5b6470; }
tr.verdict td { padding-top: 0; color: #3a4350; } tr:has(+ tr.verdict) td { border-bottom: none; }
.wide { overflow-x: auto; }
.badge { display: inline-block; font-size: 11.5px; font-weight: 600; border-radius: 10px; padding: 1px 8px; }
.chosen-b { background: #2e7d32; color: #fff; } .tied-b { background: #f0b429; color: #3d2c00; }
.rejected-b { background: #c62828; color: #fff; } .fail { color: #c62828; font-weight: 600; }
.pass { color: #2e7d32; font-weight: 600; }
.choice { font-size: 15.5px; margin: 4px 0 8px; } .note { color: #8a5a00; }
.missing { color: #c62828; font-weight: 600; }
nav ul { margin: 4px 0 0; padding-left: 20px; }
svg text { font: 12px system-ui, sans-serif; fill: #1d232b; }
"""

_BAR = {"chosen": "#2e7d32", "tied": "#f0b429", "other": "#5c7c99", "rejected": "#b0b6bd"}


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def render(report: Report) -> str:
    """The whole page."""
    generated = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(report.generated_at))
    index = "".join(f'<li><a href="#{_anchor(s)}">{_e(s.step.step)}</a>: '
                    + (f"chose <b>{_e(s.chosen)}</b>" if s.chosen else f'<span class="missing">{_e(s.note or "")}</span>')
                    + "</li>" for s in report.selections)
    deployed = f", published models read from <code>{_e(report.deployed)}</code>" if report.deployed else ""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>optbuild report: '
            f'{_e(report.project.name)}</title><style>{_CSS}</style></head><body>\n'
            f'<h1>What the build chose</h1><p class="meta">project <code>{_e(report.project)}</code>, '
            f"from its build folder and optbuild.lock{deployed}; written {_e(generated)} by optbuild "
            f"{_e(__version__)}</p>\n<nav>{len(report.selections)} select step(s):<ul>{index}</ul></nav>\n"
            + "\n".join(_selection(s) for s in report.selections) + "\n</body></html>\n")


def _anchor(selection: Selection) -> str:
    return "s-" + "".join(c if c.isalnum() else "-" for c in selection.step.step)


def _selection(s: Selection) -> str:
    parts = [f'<section id="{_e(_anchor(s))}"><h2>{_e(s.step.step)}</h2>']
    if not s.built:
        parts.append(f'<p class="missing">{_e(s.note)}</p><p>Its candidates in the recipe: '
                     + ", ".join(f"<code>{_e(v.benchmark.step)}</code>" for v in s.variants) + "</p>")
    else:
        parts += [_choice(s), _chart(s), _variants(s)]
    parts += [_keys(s), _deployments(s), "</section>"]
    return "\n".join(parts)


def _choice(s: Selection) -> str:
    """The choice and why: the winner, its verdict, the tie and its rule, how it was measured."""
    winner = next((v for v in s.variants if v.chosen), None)
    lines = [f'<p class="choice">Chosen: <b>{_e(s.chosen)}</b>'
             + (f" (the model of <code>{_e(winner.model.step)}</code>)" if winner and winner.model else "")
             + f", by {_e(s.objective)}"
             + (f" under the constraints {_e(_constraints(s.constraints))}" if s.constraints else "") + "</p>"]
    if winner and winner.why and s.tie_with:
        lines.append(f"<p>Why: {_e(winner.why.removeprefix('chosen: '))}.</p>")
    elif (next_best := _runner_up(s)) is not None and next_best.lead is not None:
        lead = next_best.lead
        lines.append(f"<p>Why: it measured {lead.ratio:.2f}x faster than the next, {_e(next_best.benchmark.step)} "
                     f"(interval {lead.low:.2f}-{lead.high:.2f}x), beyond the noise and min_lead.</p>")
    if s.tie_with:
        lines.append(f"<p>A tie with {_e(', '.join(s.tie_with))}, broken by <b>{_e(s.tie_broken_by)}</b>. The tie "
                     "rule: a lead whose interval reaches below 1 + min_lead is a tie; it goes to the smaller model "
                     "(by more than 5 %), then to the candidate listed first, among those measured within min_lead "
                     "of the fastest; where the fastest is alone there, to it.</p>")
    lines.append(f"<p>{_e(_measured(s))}</p>")
    if s.race:
        lines += [f'<p class="note">note: {_e(n)}</p>' for n in s.race.notes]
        if s.race.undecided:
            lines.append(f'<p class="note">note: the lead over {_e(", ".join(s.race.undecided))} was still '
                         f"undecided after {s.race.rounds_run} rounds: judged a tie</p>")
    return "\n".join(lines)


def _runner_up(s: Selection) -> Variant | None:
    """The variant not dropped that the winner led by least."""
    others = [v for v in s.variants if not v.chosen and not v.rejected and v.lead is not None]
    return min(others, key=lambda v: v.lead.ratio if v.lead else 0.0, default=None)


def _constraints(constraints: dict[str, Any]) -> str:
    return ", ".join(f"{k} = {v}" for k, v in constraints.items())


def _measured(s: Selection) -> str:
    if s.measure != "together":
        return "Judged by the figures each benchmark step measured on its own (measure = \"cached\")."
    if s.race is None:
        return "Measured together: no candidate could be measured."
    r = s.race
    more = f" (+{r.rounds_run - r.rounds} while a lead was undecided)" if r.rounds_run > r.rounds else ""
    load = r.load
    others = (f", other processes took {load['others_cpu']:.0%} of them"
              if isinstance(load.get("others_cpu"), (int, float)) else "")
    return (f"Measured together in select's own process: {r.runs} timed runs each in {r.rounds} rounds{more}, "
            f"{r.warmup} warm-up, the order rotating, {r.seconds:g} s in all; load average "
            f"{load.get('load_average')} on {load.get('cpu_count')} CPUs{others}. A lead is judged with its "
            f"{r.interval:.0%} interval over the rounds; min_lead {r.min_lead:g}.")


def _kind(v: Variant) -> str:
    return "chosen" if v.chosen else "rejected" if v.rejected else "tied" if v.tied else "other"


def _ms(value: float) -> str:
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def _step_size(top: float) -> float:
    """A round tick step (1, 2 or 5 times a power of ten) giving about five ticks up to ``top``."""
    raw = top / 5
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def _chart(s: Selection) -> str:
    """Horizontal bars of p50 measured together, whiskers from p10 to p90, one row a variant."""
    if s.measure != "together":
        return "<p>No chart: the variants were not measured together.</p>"
    rows = s.variants
    measured = [v.together for v in rows if v.together]
    if not measured:
        return "<p>No chart: no variant was measured together.</p>"
    top = max(t["p90_ms"] for t in measured) * 1.08 or 1.0
    step = _step_size(top)
    left, width, right, height, head = 280, 560, 150, 30, 26
    total = left + width + right
    scale = width / top

    def x(ms: float) -> float:
        return left + ms * scale

    svg = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{total}" height="{head + height * len(rows) + 30}" '
            'role="img" aria-label="latency measured together, ms">'),
           (f'<text x="{left}" y="16" font-weight="600">latency measured together (ms): bar p50, whiskers p10 to '
            "p90</text>")]
    ticks = [i * step for i in range(int(top / step) + 1)]
    bottom = head + height * len(rows)
    for tick in ticks:
        svg.append(f'<line x1="{x(tick):.1f}" y1="{head}" x2="{x(tick):.1f}" y2="{bottom}" stroke="#e1e5ea"/>'
                   f'<text x="{x(tick):.1f}" y="{bottom + 16}" text-anchor="middle">{_e(_ms(tick))}</text>')
    for i, v in enumerate(rows):
        y = head + i * height
        label = ("★ " if v.chosen else "") + v.benchmark.step
        weight = ' font-weight="700"' if v.chosen else ""
        svg.append(f'<text x="{left - 8}" y="{y + 19}" text-anchor="end"{weight}>{_e(_clip(label, 40))}'
                   f"<title>{_e(label)}</title></text>")
        t = v.together
        if t is None:
            why = "; ".join(v.rejected) or "not measured"
            svg.append(f'<text x="{left + 6}" y="{y + 19}" fill="#80868e">{_e(_clip(why, 90))}<title>{_e(why)}'
                       "</title></text>")
            continue
        color, mid = _BAR[_kind(v)], y + height / 2
        svg.append(f'<rect x="{left}" y="{y + 7}" width="{max(t["p50_ms"] * scale, 1):.1f}" height="{height - 14}" '
                   f'fill="{color}" rx="2"><title>p50 {_e(_ms(t["p50_ms"]))} ms</title></rect>'
                   f'<line x1="{x(t["p10_ms"]):.1f}" y1="{mid}" x2="{x(t["p90_ms"]):.1f}" y2="{mid}" stroke="#1d232b" '
                   'stroke-width="1.5"/>'
                   + "".join(f'<line x1="{x(t[p]):.1f}" y1="{mid - 6}" x2="{x(t[p]):.1f}" y2="{mid + 6}" '
                             'stroke="#1d232b" stroke-width="1.5"/>' for p in ("p10_ms", "p90_ms"))
                   + f'<text x="{x(t["p90_ms"]) + 8:.1f}" y="{y + 19}">{_e(_ms(t["p50_ms"]))} ms '
                   f'({_e(_ms(t["p10_ms"]))}-{_e(_ms(t["p90_ms"]))})</text>')
    svg.append("</svg>")
    return "\n".join(svg)


def _clip(text: str, length: int) -> str:
    return text if len(text) <= length else text[:length - 1] + "…"


def _variants(s: Selection) -> str:
    together = s.measure == "together"
    head = ["variant", "p50 ms" + (" (p10-p90)" if together else ""), *(["alone p50"] if together else []),
            "per s", "MiB", "verify", "worst cosine", "max abs", "max rel", "top-1",
            *(["winner's lead"] if together else [])]
    rows = "".join(_variant_row(v, together, len(head)) for v in s.variants)
    return ('<h3>Variants</h3><div class="wide"><table><thead><tr>' + "".join(f"<th>{_e(h)}</th>" for h in head)
            + f"</tr></thead><tbody>{rows}</tbody></table></div>")


def _variant_row(v: Variant, together: bool, columns: int) -> str:
    """The variant's figures, then a row beneath with why it won, lost or was dropped."""
    f, t, alone = v.figures or {}, v.together, v.benchmarked or {}
    badge = {"chosen": '<span class="badge chosen-b">chosen</span> ', "tied": '<span class="badge tied-b">tied</span> ',
             "rejected": '<span class="badge rejected-b">dropped</span> ', "other": ""}[_kind(v)]
    model = f"<br><small>model <code>{_e(v.model.step)}</code></small>" if v.model else ""
    runtime = f"<br><small>{_e(v.runtime)}</small>" if v.runtime else ""
    spread = f"<br><small>{_e(_ms(t['p10_ms']))}-{_e(_ms(t['p90_ms']))}</small>" if t else ""
    size = f.get("size_bytes", alone.get("size_bytes"))
    numbers = [_cell(f.get("p50_ms"), _ms) + spread, *([_cell(alone.get("p50_ms"), _ms)] if together else []),
               _cell(f.get("throughput_per_s"), lambda n: f"{n:,.0f}"),
               _cell(None if size is None else size / (1 << 20), lambda n: f"{n:.2f}")]
    verdict, *figures = _verify_cells(v.verify)
    lead = ([_e(f"{v.lead.ratio:.2f}x") + f"<br><small>{_e(f'{v.lead.low:.2f}-{v.lead.high:.2f}x')}</small>"
             if v.lead else "–"] if together else [])
    why = "; ".join(v.rejected) if v.rejected else v.why or ""
    return (f'<tr class="{_kind(v)}"><td>{badge}<code>{_e(v.benchmark.step)}</code>{model}{runtime}</td>'
            + "".join(f'<td class="n">{c}</td>' for c in numbers) + f"<td>{verdict}</td>"
            + "".join(f'<td class="n">{c}</td>' for c in [*figures, *lead]) + "</tr>"
            + f'<tr class="{_kind(v)} verdict"><td colspan="{columns}">{_e(why)}</td></tr>')


def _cell(value: float | None, fmt: Any) -> str:
    return "–" if value is None else _e(fmt(value))


def _verify_cells(verify: Verify | None) -> list[str]:
    """verdict, worst cosine (and where), max abs, max rel, top-1."""
    if verify is None:
        return ["no verify step", "–", "–", "–", "–"]
    step = f"<br><small><code>{_e(verify.step)}</code></small>"
    if not verify.built or verify.problem:
        verdict = f'<span class="missing">{_e(verify.problem)}</span>' if verify.problem else "not built"
        return [verdict + step, "–", "–", "–", "–"]
    verdict = '<span class="pass">passed</span>' if verify.passed else '<span class="fail">failed</span>'
    at = f"<br><small>at {_e(verify.cosine_at)}</small>" if verify.cosine_at else ""
    return [verdict + step, _cell(verify.cosine, lambda n: f"{n:.9f}") + at,
            _cell(verify.max_abs, lambda n: f"{n:.3g}"), _cell(verify.max_rel, lambda n: f"{n:.3g}"),
            _cell(verify.top1, lambda n: f"{n:.2%}")]


def _key(key: object) -> str:
    if not isinstance(key, str):
        return '<span class="missing">no record in optbuild.lock</span>'
    return f'<code title="{_e(key)}">{_e(key[:KEY_SHOWN])}</code>'


def _keys(s: Selection) -> str:
    """Each artifact's key, as optbuild.lock records the last build of its step."""
    rows = [("select", s.step.step, s.step.key)]
    for v in s.variants:
        if v.model:
            rows.append(("model", v.model.step, v.model.key))
        if v.verify:
            rows.append(("verify", v.verify.step, v.verify.key))
        rows.append(("benchmark", v.benchmark.step, v.benchmark.key))
    rows += [("deploy", d.step.step, d.step.key) for d in s.deployments]
    body = "".join(f"<tr><td>{_e(role)}</td><td><code>{_e(step)}</code></td><td>{_key(key)}</td></tr>"
                   for role, step, key in rows)
    return ("<h3>Artifact keys</h3><p>From optbuild.lock: the key of each step's last build (the first "
            f"{KEY_SHOWN} hex digits; hover for the whole key).</p><table><thead><tr><th>role</th><th>step</th>"
            f"<th>key</th></tr></thead><tbody>{body}</tbody></table>")


def _deployments(s: Selection) -> str:
    if not s.deployments:
        return "<h3>Deployed</h3><p>No deploy step takes this select step's choice.</p>"
    return "<h3>Deployed</h3>" + "".join(_deployment(d) for d in s.deployments)


def _deployment(d: Deployment) -> str:
    built = (f"holds version {_e(', '.join(d.built))} in the build folder" if d.built
             else '<span class="missing">not built</span>')
    parts = [(f"<p>Deploy step <code>{_e(d.step.step)}</code> (key {_key(d.step.key)}): model "
              f"<b>{_e(d.model)}</b>, {built}.</p>")]
    if d.repository is None:
        parts.append("<p><small>Pass <code>--deployed DIR</code> (the repository of <code>optbuild deploy --to DIR"
                     "</code>) to show what is published there.</small></p>")
        return "".join(parts)
    if d.note:
        return "".join([*parts, f'<p class="note">{_e(d.note)}</p>'])
    rows = "".join(_published_row(p.version, p.served, p.record, d.step.key) for p in d.published)
    head = (f"<table><thead><tr><th>version in <code>{_e(d.repository / d.model)}</code></th><th>served</th>"
            "<th>step</th><th>key</th><th>chosen</th><th>built on</th><th>from</th><th>published</th></tr></thead>")
    return "".join([*parts, f"{head}<tbody>{rows}</tbody></table>"])


def _published_row(version: int, served: bool, record: dict[str, Any], key: str | None) -> str:
    published = record.get("published_at")
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(published)) if isinstance(published, (int, float)) else "–"
    same = " (this build's)" if key is not None and record.get("key") == key else ""
    cells = [str(version), "served" if served else "", record.get("step") or "–",
             None, _chosen(record) or "–", record.get("built_on") or "–", record.get("from") or "–",
             f"{when} on {record.get('published_on') or '?'}"]
    return ("<tr" + (' class="chosen"' if served else "") + ">"
            + "".join(f"<td>{_key(record.get('key')) + _e(same) if c is None else _e(c)}</td>" for c in cells)
            + "</tr>")


def _chosen(record: dict[str, Any]) -> str | None:
    """Which candidate the published model is: the select step's choice, recorded with the
    deploy step's input (optbuild.app.deploy)."""
    inputs = record.get("inputs")
    found = [i.get("chosen") for i in inputs.values() if isinstance(i, dict)] if isinstance(inputs, dict) else []
    return next((str(c) for c in [record.get("chosen"), *found] if c), None)
