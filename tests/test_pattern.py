"""The staged joint refinement's compass search over the two concurrency knobs: pure logic
on tiny inputs."""

from __future__ import annotations

from collections.abc import Callable

from autotune.tuning.search.pattern import MOVES, SCALES, next_on_plane


def _clip(lo: tuple[int, int], hi: tuple[int, int]) -> Callable[[float, float], tuple[int, int]]:
    def clip(seqs: float, tokens: float) -> tuple[int, int]:
        return (
            min(max(round(seqs), lo[0]), hi[0]),
            min(max(round(tokens), lo[1]), hi[1]),
        )

    return clip


WIDE = _clip((1, 1), (10**6, 10**6))


def test_moves_go_round_the_best_point_trades_first_then_finer() -> None:
    home = (64, 1024)
    tried: set[tuple[int, int]] = {home}
    seen = []
    while (p := next_on_plane(home, tried, WIDE)) is not None:
        seen.append(p)
        tried.add(p)
    # an octave first: more sequences at a smaller budget, then the opposite trade, then
    # both up, both down, then one knob alone
    assert seen[:8] == [
        (128, 512),
        (32, 2048),
        (128, 2048),
        (32, 512),
        (128, 1024),
        (64, 2048),
        (32, 1024),
        (64, 512),
    ]
    # then half an octave (x1.414), then a quarter (x1.189): every move at every scale, once
    assert seen[8:10] == [(91, 724), (45, 1448)]
    assert seen[16:18] == [(76, 861), (54, 1218)]
    assert len(seen) == len(MOVES) * len(SCALES) == len(set(seen))


def test_a_won_move_is_the_new_centre_and_the_way_back_is_not_retried() -> None:
    tried = {(64, 1024), (128, 512)}
    # (128, 512) won: from it, the first move would be (256, 256), the second (64, 1024),
    # where the search came from
    assert next_on_plane((128, 512), tried, WIDE) == (256, 256)
    tried.add((256, 256))
    assert next_on_plane((128, 512), tried, WIDE) == (256, 1024)  # (64, 1024) skipped


def test_moves_clipped_onto_the_best_point_or_a_tried_one_are_skipped() -> None:
    # at the floor of both ranges, every move down clips back onto the best point
    clip = _clip((8, 256), (16, 512))
    home = (8, 256)
    tried = {home}
    seen = []
    while (p := next_on_plane(home, tried, clip)) is not None:
        seen.append(p)
        tried.add(p)
    assert home not in seen and len(seen) == len(set(seen))
    assert all(8 <= m <= 16 and 256 <= t <= 512 for m, t in seen)
    assert seen[0] == (16, 256)  # (16, 128) clipped up to the floor of the budget
    assert next_on_plane(home, tried, clip) is None


def test_a_diagonal_move_that_tied_splits_into_its_two_axis_moves_first() -> None:
    home = (60, 406)
    # (120, 256) held exactly the home's capacity: more sequences gained what the smaller
    # budget lost, so each knob alone comes next, the sequences first
    tried = {home, (120, 256)}
    assert next_on_plane(home, tried, WIDE) == (120, 203)  # no tie: the next diagonal
    assert next_on_plane(home, tried, WIDE, ties=[(120, 256)]) == (120, 406)
    tried.add((120, 406))
    assert next_on_plane(home, tried, WIDE, ties=[(120, 256)]) == (60, 256)
    tried.add((60, 256))
    # both axis moves tried: back to the usual order
    assert next_on_plane(home, tried, WIDE, ties=[(120, 256)]) == next_on_plane(home, tried, WIDE)


def test_a_tie_on_one_axis_or_clipped_onto_a_tried_point_adds_no_move() -> None:
    home = (64, 1024)
    tried = {home, (128, 1024), (64, 2048)}
    # a tie that moved one knob only has no second knob to try alone
    assert next_on_plane(home, tried, WIDE, ties=[(128, 1024)]) == (128, 512)
    # a tied diagonal whose axis moves were tried already
    tried |= {(128, 2048)}
    assert next_on_plane(home, tried, WIDE, ties=[(128, 2048)]) == (128, 512)
