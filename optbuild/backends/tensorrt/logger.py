"""TensorRT's log as data: builder and runtime errors arrive as logger messages (and a None
result), not as exceptions, so callers read them back here to write a clear error.

TensorRT keeps the first logger a process gives it (a later builder's or runtime's logger is
ignored, with a warning), so each module gets one logger for the process, whose messages go
to the list of the operation under way. Steps run one per worker process; tests build one
at a time.
"""

from __future__ import annotations

from typing import Any

_LOGGERS: dict[str, Any] = {}
# Emitted on every first builder of TensorRT-RTX 1.7 as INTERNAL_ERROR, harmless.
_NOISE = ("Thread context has not been set",)


def capture_logger(trt: Any) -> Any:
    """The process's logger for module ``trt``, its message list emptied."""
    if trt.__name__ not in _LOGGERS:

        class CaptureLogger(trt.ILogger):
            def __init__(self) -> None:
                trt.ILogger.__init__(self)
                self.messages: list[tuple[int, str]] = []

            def log(self, severity: Any, msg: str) -> None:
                if int(severity) <= int(trt.ILogger.Severity.WARNING) and not msg.startswith(_NOISE):
                    self.messages.append((int(severity), msg))

        _LOGGERS[trt.__name__] = CaptureLogger()
    logger = _LOGGERS[trt.__name__]
    logger.messages = []
    return logger


def errors(trt: Any, logger: Any) -> list[str]:
    """Messages of severity ERROR or worse since the logger was last taken."""
    limit = int(trt.ILogger.Severity.ERROR)
    return [msg for severity, msg in logger.messages if severity <= limit]


def warnings(trt: Any, logger: Any) -> list[str]:
    """WARNING messages since the logger was last taken."""
    return [msg for severity, msg in logger.messages
            if severity == int(trt.ILogger.Severity.WARNING)]


def quote(messages: list[str], limit: int = 12) -> str:
    """Messages as indented lines for an error, at most ``limit`` of them."""
    shown = [f"  {m}" for m in messages[:limit]]
    if len(messages) > limit:
        shown.append(f"  ... and {len(messages) - limit} more")
    return "\n".join(shown)
