"""Errors that reach users: each names the file or field at fault and what was expected."""


class TptuneError(Exception):
    """Base class of every error tptune reports to a user (no traceback needed)."""


class ConfigError(TptuneError):
    """A model/workload/run config is missing a field, mistyped, or inconsistent.

    ``problems`` keeps every problem found, so one run reports them all at once.
    """

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid config {source}:\n{lines}")


class RecordError(TptuneError, ValueError):
    """A record a run wrote (a member's run.json, a TP point's point.json) is malformed: names the file and
    the field. A ValueError too, so a reader that skips unreadable records skips it."""


class TraceError(TptuneError):
    """A profiler trace cannot be analysed (corrupt, truncated, not a trace, no events)."""
