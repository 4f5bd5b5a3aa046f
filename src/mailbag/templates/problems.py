"""What an operator is told when a template of theirs cannot be compiled or rendered: the
part, the line, the problem (templates/sandbox.py and templates/mjml.py raise these)."""

from __future__ import annotations

from dataclasses import dataclass

from mailbag.templates import TemplateError

__all__ = ["Problem", "RenderBudgetExceeded", "TemplateError", "TemplateProblems"]


@dataclass(frozen=True)
class Problem:
    """What an operator is told: which part, which line, what."""

    part: str  # "subject" | "html" | "text", or "<library name>/<kind>" ("layout/html")
    line: int | None
    message: str

    def __str__(self) -> str:
        where = self.part if self.line is None else f"{self.part} line {self.line}"
        return f"{where}: {self.message}"


class TemplateProblems(TemplateError):
    """The template cannot be compiled or rendered; `problems` says where and why."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("; ".join(str(problem) for problem in problems))


class RenderBudgetExceeded(TemplateError):
    """The render spent its time or size budget; the message says which, and where."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        self.problems = [problem]
        super().__init__(str(problem))
