"""Compare a candidate token sequence with the sequential reference.

The implicit-join bug passed unit tests and perplexity; what users saw was text
repeating with a one-step lag. So the diagnosis here is about sequences: where
they first diverge, what both say around it, how many divergent positions the
lag explains (candidate[t] == reference[t-1]), and runs of repeated tokens.
Pure Python: tokens are ints.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence


@dataclass(frozen=True)
class Comparison:
    reference: tuple
    candidate: tuple
    first_divergence: Optional[int]  # None: identical
    divergent: int  # positions t (over the common length) where they differ
    lag1: int  # of those, positions where candidate[t] == reference[t-1]
    longest_repeat: int  # longest run of one token repeated in the candidate
    reference_longest_repeat: int

    @property
    def matches(self) -> bool:
        return self.first_divergence is None

    @property
    def lag1_share(self) -> float:
        return self.lag1 / self.divergent if self.divergent else 0.0

    def summary(self) -> str:
        if self.matches:
            return f"tokens match the sequential reference ({len(self.reference)} tokens)"
        return (f"first divergence at token {self.first_divergence} of {len(self.reference)}; "
                f"{self.divergent} divergent positions, {self.lag1} ({self.lag1_share:.0%}) explained by a one-step "
                f"lag (candidate[t] == reference[t-1]); longest repeated-token run {self.longest_repeat} "
                f"(reference: {self.reference_longest_repeat})")


def _longest_run(tokens: Sequence[int]) -> int:
    best = run = 0
    prev = object()
    for tok in tokens:
        run = run + 1 if tok == prev else 1
        best = max(best, run)
        prev = tok
    return best


def compare_tokens(reference: Sequence[int], candidate: Sequence[int]) -> Comparison:
    ref, cand = tuple(int(t) for t in reference), tuple(int(t) for t in candidate)
    n = min(len(ref), len(cand))
    first = next((t for t in range(n) if ref[t] != cand[t]), None)
    if first is None and len(ref) != len(cand):
        first = n
    divergent = [t for t in range(n) if ref[t] != cand[t]]
    lag1 = sum(1 for t in divergent if t > 0 and cand[t] == ref[t - 1])
    return Comparison(ref, cand, first, len(divergent), lag1, _longest_run(cand), _longest_run(ref))


def side_by_side(comparison: Comparison, decode: Callable[[Sequence[int]], str] = None,
                 before: int = 24, after: int = 40) -> str:
    """An aligned excerpt around the first divergence: one column per position."""
    if comparison.matches:
        return "(no divergence)"
    decode = decode or (lambda toks: " ".join(str(t) for t in toks))
    t = comparison.first_divergence
    lo, hi = max(0, t - before), t + after
    ref, cand = comparison.reference[lo:hi], comparison.candidate[lo:hi]

    def cell(tok) -> str:
        text = decode([tok])
        return repr(text)[1:-1] if text.isprintable() and len(text) == 1 else f"<{tok}>"

    width = max(len(cell(x)) for x in ref + cand) if ref + cand else 1
    row = lambda toks: "".join(cell(x).ljust(width) for x in toks)  # noqa: E731
    marker = " " * ((t - lo) * width) + "^" + f" token {t}"
    return f"reference: {row(ref)}\ncandidate: {row(cand)}\n           {marker}"


def format_comparison(comparison: Comparison, decode=None, race_report: str = "") -> str:
    """What an assertion message shows: summary, the aligned excerpt, the race report."""
    parts = [comparison.summary()]
    if not comparison.matches:
        parts.append(side_by_side(comparison, decode))
    if race_report:
        parts.append(race_report)
    return "\n\n".join(parts)
