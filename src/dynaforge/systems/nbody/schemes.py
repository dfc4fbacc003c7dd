"""Coefficient tables of the symplectic N-body integrators (the algorithm is `nbody.composition_step`).

Every scheme is a symmetric composition of kick-drift-kick leapfrog substeps with weights w_k (sum 1):
a step of size h runs leapfrog substeps of sizes w_1 h, w_2 h, ... in order. Symmetric weights give a
time-reversible symplectic method of even order. Consecutive half-kicks share one force evaluation, so a
step costs `len(weights)` force evaluations (the acceleration at the end of a step is reused at the start
of the next one).
"""

from __future__ import annotations

from typing import NamedTuple


class Composition(NamedTuple):
    """A symmetric composition of leapfrog substeps."""

    name: str
    order: int
    """Global order of accuracy in the step size."""
    weights: tuple[float, ...]
    """Substep sizes as fractions of the step; they sum to one."""

    @property
    def force_evaluations(self) -> int:
        """Force evaluations per step (first-same-as-last reuse included)."""
        return len(self.weights)


def triple_jump(order: int) -> tuple[float, float]:
    """Yoshida's (1990) triple-jump weights (w1, w0): w1, w0, w1 raises a symmetric method of order
    `order` to order + 2. w1 = 1 / (2 - 2^(1/(order+1))), w0 = 1 - 2 w1 (negative: one substep goes back)."""
    root = 2.0 ** (1.0 / (order + 1))
    w1 = 1.0 / (2.0 - root)
    return w1, 1.0 - 2.0 * w1


_W1, _W0 = triple_jump(2)

LEAPFROG = Composition("leapfrog", 2, (1.0,))
YOSHIDA4 = Composition("yoshida4", 4, (_W1, _W0, _W1))

SCHEMES: dict[str, Composition] = {
    "leapfrog": LEAPFROG,
    "yoshida4": YOSHIDA4,
}
