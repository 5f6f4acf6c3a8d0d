"""A finding: what the comparisons concluded, before it becomes a contract verdict."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Finding:
    kind: str                 # slow | hang
    component: str
    scope: str                # rank | node | job
    node: str = ""
    rank: int = -1
    gpu: int = -1
    fn: str = ""
    slowdown: float = 1.0
    score: float = 0.0
    confidence: float = 0.0
    peers: list[int] = field(default_factory=list)
    victims: list[int] = field(default_factory=list)
    culprits: list[int] = field(default_factory=list)   # ranks the finding blames (for victim separation)
    evidence: dict[str, Any] = field(default_factory=dict)
    summary: str = ""
    # The effect is a level, seen in the window's best steps too, not one odd step
    # (a kernel spike, a stray pause): only a steady finding may alarm from one window.
    steady: bool = True
    # The level is paid by the median of the window's steps, and there are enough of them
    # (detector.MOST_STEPS_MIN) that odd steps cannot make a median: a problem that began
    # inside this window (its onset) and lasted most of it. Such a finding may alarm from
    # its onset window too, so a fault is named within two windows wherever it begins.
    most_steps: bool = False
    # Whether the window's steps can confirm it (detector.evidence_steps): a level paid per step can;
    # sporadic pauses on varying ranks (GC) are no level, and only windows confirm them.
    step_evidence: bool = True


def confidence_of(ratio: float, z: float, material: float, material_full: float = 0.05) -> float:
    """How sure a single window makes us, from effect size, significance and cost.

    ``ratio``: slowdown against peers; ``z``: robust z-score; ``material``: the
    share of the step the problem costs (full weight at ``material_full``). Each saturates; the weakest one bounds
    the result, so a huge z on a negligible cost stays unsure.
    """
    effect = min(1.0, max(0.0, (ratio - 1.0) / 0.3))
    signif = min(1.0, max(0.0, (z - 3.0) / 7.0))
    cost = min(1.0, max(0.0, material / material_full))
    return round(float(min(0.99, 0.2 + 0.79 * min(effect, signif, cost))), 3)
