"""What ``callbox doctor`` prints: one result per check, the text report and its summary."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

Status = Literal["PASS", "WARN", "FAIL"]
Scope = Literal["container", "daemon", "host", "cluster"]

CIS_VERSION = "CIS Docker Benchmark v1.2.0"


@dataclass(frozen=True)
class CheckResult:
    id: str
    title: str
    status: Status
    reason: str
    scope: Scope

    def to_json(self) -> dict[str, str]:
        return {"id": self.id, "title": self.title, "status": self.status, "reason": self.reason,
                "scope": self.scope}

    def line(self, id_width: int = 0) -> str:
        return f"{self.status}  {self.id:<{id_width}}  {self.title}: {self.reason}"


def result_maker(check_id: str, title: str, scope: Scope) -> Callable[[Status, str], CheckResult]:
    """A constructor of one check's result: only the status and the reason vary."""

    def make(status: Status, reason: str) -> CheckResult:
        return CheckResult(check_id, title, status, reason, scope)

    return make


def summary(results: Iterable[CheckResult]) -> str:
    items = list(results)
    counts = {s: sum(r.status == s for r in items) for s in ("PASS", "WARN", "FAIL")}
    numbering = f" (container items: {CIS_VERSION} section 5 numbering)" if any(
        r.scope == "container" for r in items) else ""
    return (f"callbox doctor: {len(items)} checks, {counts['PASS']} pass, {counts['WARN']} warn, "
            f"{counts['FAIL']} fail{numbering}")


def render_text(results: Iterable[CheckResult]) -> str:
    items = list(results)
    width = max((len(r.id) for r in items), default=0)
    return "\n".join([*(r.line(width) for r in items), summary(items)])

