"""Runs one step in its own process: ``python -m optbuild.worker SPEC.json``.

A crash in a native library (onnxsim, TensorRT) kills this process, not the build. The
spec and the result travel as JSON files; stdout and stderr go to the step's log.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path


def _die_with_parent(parent: int) -> None:
    """Linux: get SIGKILL when the builder dies, so no orphan keeps building."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass
    if os.getppid() != parent:
        os._exit(1)


def run(spec: dict) -> dict:
    from optbuild.errors import OptbuildError
    from optbuild.fingerprint import Fingerprint
    from optbuild.steps.base import Artifact, StepContext
    from optbuild.steps.registry import step_class

    cls = step_class(spec["kind"])
    params = cls.Params.model_validate(spec["params"])
    base_dir, root = Path(spec["base_dir"]), Path(spec["project_root"])
    step = cls(params, base_dir, root)
    inputs = {
        name: Artifact(
            step=a["step"],
            dir=Path(a["dir"]),
            files={k: Path(v) for k, v in a["files"].items()},
            primary=Path(a["primary"]) if a["primary"] else None,
        )
        for name, a in spec["inputs"].items()
    }
    ctx = StepContext(
        step_id=spec["step_id"],
        base_dir=base_dir,
        project_root=root,
        out_dir=Path(spec["out_dir"]),
        inputs=inputs,
        host=Fingerprint(),
        state_dir=Path(spec["state_dir"]) if spec.get("state_dir") else None,
    )
    started = time.perf_counter()
    try:
        step.run(ctx)
    except OptbuildError as exc:
        return {"ok": False, "error": str(exc), "expected": True}
    except Exception as exc:  # a bug or a tool failure: full traceback in the log
        traceback.print_exc()
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"ok": True, "metrics": ctx.metrics, "run_s": time.perf_counter() - started}


def main() -> None:
    spec_path = Path(sys.argv[1])
    spec = json.loads(spec_path.read_text())
    _die_with_parent(spec["parent_pid"])
    result = run(spec)
    result_path = Path(spec["result"])
    tmp = result_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, default=str))
    os.replace(tmp, result_path)


if __name__ == "__main__":
    main()
