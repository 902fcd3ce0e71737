"""The staged joint refinement's next point: a compass search over the two concurrency knobs
(pure; docs/tuning.md#8-the-staged-plan, "The joint refinement").

The coordinate passes tune ``max_num_seqs`` at one token budget, then the budget at that
concurrency. Where the two trade against each other (a smaller budget shortens each step, so
more sequences fit under a p99 TPOT limit), the best point lies along a ridge that neither
axis reaches alone. A multivariate TPE given five trials draws nearly at random over ranges
of several octaves (three of one study's five had budgets of 34,688 to 47,563 tokens); this
search moves only from the best point found so far, along the diagonals first, then the
axes, by an octave, then half, then a quarter (a compass search). Every move that does not
win is a trial that settled or scored below the best, which is all it needs to know, and it
draws no random numbers: the same trials give the same next point. A diagonal move that tied
the best point is the exception: its two axis moves come next.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

__all__ = ["MOVES", "SCALES", "next_on_plane"]

# (max_num_seqs, max_num_batched_tokens) directions, tried in this order: the trades first
# (more sequences at a smaller budget, fewer at a larger one), then both up or down, then one
# knob alone
MOVES: tuple[tuple[int, int], ...] = (
    (1, -1),
    (-1, 1),
    (1, 1),
    (-1, -1),
    (1, 0),
    (0, 1),
    (-1, 0),
    (0, -1),
)
# steps in octaves, coarse to fine: the trade between the knobs moved the best point by up
# to an octave of each in the traced studies (docs/tuning.md#8-the-staged-plan), and half an
# octave is the coordinate passes' own polish (POLISH)
SCALES: tuple[float, ...] = (1.0, 0.5, 0.25)


def next_on_plane(
    home: tuple[int, int],
    tried: Collection[tuple[int, int]],
    clip: Callable[[float, float], tuple[int, int]],
    ties: Sequence[tuple[int, int]] = (),
) -> tuple[int, int] | None:
    """The first point around ``home`` (the best so far) not yet ``tried``: at the largest
    scale that has one, in :data:`MOVES` order; None when every move is tried at every
    scale. ``clip(seqs, tokens)`` rounds a point into the valid ranges (the budget's range
    depends on the sequences).

    ``ties``: tried points that held exactly the home's capacity. A diagonal move that tied
    moved two knobs whose effects cancelled: unless neither knob mattered, one of them alone
    gains. So its two axis moves (its sequences at the home's budget, then the home's
    sequences at its budget) come before any other move."""
    m, t = home
    for tm, tt in ties:
        if tm != m and tt != t:
            for point in (clip(tm, t), clip(m, tt)):
                if point != (m, t) and point not in tried:
                    return point
    for scale in SCALES:
        f = 2.0**scale
        for dm, dt in MOVES:
            point = clip(m * f**dm, t * f**dt)
            if point != (m, t) and point not in tried:
                return point
    return None
