"""optbuild explain TARGET: the key's ingredients and the cached result's provenance."""

from __future__ import annotations

import argparse
import difflib
import json
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from optbuild.api import Workspace


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="TARGET", help="recipe:step")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--log", action="store_true", help="also print the build log")


def resolve(ws: Workspace, target: str) -> str:
    """``target`` ("recipe:step", or a step name one recipe has) as a step id; else an error
    that suggests the closest step and lists the steps it may have meant."""
    from optbuild.common.errors import OptbuildError

    steps = ws.project.steps
    if target in steps:
        return target
    matches = [sid for sid in steps if sid.endswith(":" + target)]
    if len(matches) == 1:
        return matches[0]
    names: dict[str, list[str]] = {}  # recipe -> its step names, in recipe order
    for spec in steps.values():
        names.setdefault(spec.recipe, []).append(spec.name)
    if target in names:
        raise OptbuildError(f"{target} is a recipe: explain one of its steps: {', '.join(names[target])}")
    if matches:
        raise OptbuildError(f"{target!r} is a step of several recipes: use one of {', '.join(matches)}")
    recipe, colon, _ = target.partition(":")
    candidates = list(steps) if colon else list(dict.fromkeys(spec.name for spec in steps.values()))
    hint = difflib.get_close_matches(target, candidates, n=1)
    listed = [recipe] if recipe in names else list(names)
    raise OptbuildError("\n".join([f"unknown step {target!r}" + (f"; did you mean {hint[0]!r}?" if hint else ""),
                                   *(f"steps of {r}: {', '.join(names[r])}" for r in listed)]))


def _is_set(value: Any) -> bool:
    """Unset parameters (None, or an empty default) say nothing about this step."""
    return value is not None and value != "" and value != [] and value != {}


def run(args: argparse.Namespace) -> int:
    from optbuild import api
    from optbuild.builder.status import Status
    from optbuild.common.fingerprint import Fingerprint

    ws = api.open_workspace(args.directory)
    try:
        sid = resolve(ws, args.target)
        host = Fingerprint()
        info = api.explain(ws, sid, host=host)
        if info["status"] == Status.UNAVAILABLE:
            info["unavailable"] = ws.project.steps[sid].step.unavailable(host)
    finally:
        ws.close()
    if args.json:
        print(json.dumps(info, indent=1, default=str))
        return 0
    print(f"step:   {info['step']}")
    print(f"status: {info['status']}" + (f"  ({'; '.join(info['reasons'])})" if info["status"] != Status.CACHED else ""))
    if info.get("unavailable"):
        print(f"        cannot run here: {info['unavailable']}")
    print(f"key:    {info['key'] or 'unknown until upstream steps are built'}")
    ingredients = info.get("ingredients")
    if ingredients:
        print("ingredients:")
        for section in ("kind", "version", "salt", "hash"):
            print(f"  {section}: {ingredients.get(section)!r}")
        for section in ("params", "files", "inputs", "tools", "host"):
            values = ingredients.get(section) or {}
            if section == "params":
                values = {name: value for name, value in values.items() if _is_set(value)}
            print(f"  {section}:" + ("" if values else " {}"))
            for name, value in values.items():
                print(f"    {name} = {json.dumps(value, sort_keys=True)}")
    prov = info.get("provenance")
    if prov:
        built = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(prov["created_at"]))
        print(f"built:  {built} on {prov['built_on']} in {prov['duration_s']:.2f}s")
        for name, out in prov["outputs"].items():
            print(f"  {name}  {out['size']} bytes  {out['digest']}")
        for name, value in prov["metrics"].items():
            print(f"  metric {name} = {value}")
    if args.log and info.get("log"):
        print("log:")
        print(info["log"], end="")
    return 0
