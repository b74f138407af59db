"""optbuild explain TARGET: the key's ingredients and the cached result's provenance."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="TARGET", help="recipe:step")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--log", action="store_true", help="also print the build log")


def _is_set(value: Any) -> bool:
    """Unset parameters (None, or an empty default) say nothing about this step."""
    return value is not None and value != "" and value != [] and value != {}


def run(args: argparse.Namespace) -> int:
    from optbuild import api
    from optbuild.api import Status
    from optbuild.common.fingerprint import Fingerprint

    ws = api.open_workspace(args.directory)
    try:
        sid = ws.graph.step(args.target)
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
    if cause := info.get("cause"):  # the upstream step behind a skipped one, with its full reason
        error = cause["error"] or ""
        print("        " + (error if error.startswith(cause["step"]) else f"{cause['step']} {cause['status']}: {error}"))
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
