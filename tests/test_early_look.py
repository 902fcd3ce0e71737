"""The validation phase's early look (autotune/tuning/measure/early_look.py,
docs/tuning.md#7-validation, "Stopping early"): when it looks and at which confidence."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from autotune.store import RepeatRecord
from autotune.tuning.measure.early_look import (
    baseline_never_serves,
    final_overlength,
    look_after,
    look_confidence,
    never_led,
    overlength_bound,
    passed_over,
    settled_early,
    tied,
    tied_with,
)
from autotune.tuning.measure.interval import CandidateSummary, Interval, runs_of, summarize


@pytest.mark.parametrize(
    "repeats,look",
    [(1, None), (2, None), (3, None), (4, 3), (5, 3), (6, 4), (10, 6), (20, 12), (21, 15)],
)
def test_the_look_falls_on_a_round_boundary_past_three_fifths(
    repeats: int, look: int | None
) -> None:
    # 20 repeats run in blocks of 4 (every config has 4k runs at a round's end), 21 in
    # blocks of 5; fewer than 4 repeats leave nothing to save after 3
    assert look_after(repeats) == look


def test_the_look_spends_half_the_error_rate() -> None:
    assert look_confidence(0.95) == pytest.approx(0.975)
    assert look_confidence(0.9) == pytest.approx(0.95)


def _runs(trial: int, rates: list[float], requests: int) -> list[RepeatRecord]:
    return [
        RepeatRecord(
            "s", i, 0, trial, "candidate", {}, "x", 0, 0, overlength_rate=r, requests=requests
        )
        for i, r in enumerate(rates)
    ]


def test_the_overlength_bound_keeps_a_rate_near_its_limit_running() -> None:
    # the RAG benchmark study: 0.5 % pooled over 3 samples, 0.57 % over 5 against a 0.5 %
    # limit; 3 samples cannot settle it. A config that cut nothing in 1,200 requests can.
    near = overlength_bound(_runs(1, [0.004, 0.005, 0.006], 1000), 0.975)
    assert near is not None and near > 0.005
    clean = overlength_bound(_runs(1, [0.0, 0.0, 0.0], 400), 0.975)
    assert clean == pytest.approx(1.96**2 / 1200 / (1 + 1.96**2 / 1200), rel=1e-3)
    assert overlength_bound(_runs(1, [0.0], 0), 0.975) is None  # nothing counted


def _run(
    trial: int,
    repeat: int,
    *,
    cap: float | None = None,
    held: bool = True,
    rate: float = 0.0,
    requests: int = 400,
    done: bool = True,
    role: str = "candidate",
) -> RepeatRecord:
    return RepeatRecord(
        "s",
        repeat,
        0,
        trial,
        role,
        {"max_model_len": 4096},
        "x",
        repeat,
        0,
        state="COMPLETE" if done else "PENDING",
        slo_held=held if done else None,
        capacity_scale=cap if done else None,
        overlength_rate=rate if done else None,
        requests=requests if done else 0,
    )


def test_the_final_overlength_is_known_only_when_every_run_measured_its_prediction() -> None:
    # docs/tuning.md#7-validation, "Stopping early": what max_model_len cuts is fixed by the
    # lengths drawn, so the pending samples' rates are known when the finished ones matched
    predicted = {
        0: (0.0025, 400),
        1: (0.0125, 400),
        2: (0.0025, 400),
        3: (0.005, 400),
        4: (0.0075, 400),
    }
    done = [_run(15, i, cap=2.0, rate=predicted[i][0]) for i in range(3)]
    pending = [_run(15, i, done=False) for i in (3, 4)]
    known = final_overlength(done + pending, lambda r: predicted[r.repeat_index])
    assert known == {15: pytest.approx(12 / 2000)}  # 0.6 %, where 3 samples bound it at 1.2 %
    assert overlength_bound(done, 0.975) > 0.01
    # a finished run that cut another share, or another number of requests, than its sample
    # predicts (a tokenizer's lengths, a level that stopped early): nothing is known
    off = [_run(15, 0, cap=2.0, rate=0.005), *done[1:], *pending]
    assert final_overlength(off, lambda r: predicted[r.repeat_index]) == {}
    short = [_run(15, 0, cap=2.0, rate=0.0025, requests=380), *done[1:], *pending]
    assert final_overlength(short, lambda r: predicted[r.repeat_index]) == {}
    assert final_overlength(done + pending, lambda r: None) == {}  # no max_model_len
    # a server of 2 devices offered 2 copies of each sample: the same shares
    two = [_run(15, i, cap=2.0, rate=predicted[i][0], requests=800) for i in range(3)]
    assert final_overlength(two + pending, lambda r: predicted[r.repeat_index]) == known
    mixed = [two[0], *done[1:], *pending]  # one run offered 2 copies, the others 1
    assert final_overlength(mixed, lambda r: predicted[r.repeat_index]) == {}


def test_a_rival_that_never_led_on_a_shared_sample() -> None:
    chosen = [_run(1, i, cap=c) for i, c in enumerate([2.0, 2.04, 1.96])]
    assert never_led(
        "slo-capacity", 2, 1, chosen + [_run(2, i, cap=c) for i, c in enumerate([2.0, 2.0, 1.96])]
    )
    # it led once: the remaining repeats could make it the recommendation
    assert not never_led(
        "slo-capacity", 2, 1, chosen + [_run(2, i, cap=c) for i, c in enumerate([2.0, 2.08, 1.92])]
    )
    # where it held and the chosen config did not, the chosen one did not lead
    broke = [_run(1, 0, cap=None, held=False), *chosen[1:]]
    assert not never_led("slo-capacity", 2, 1, broke + [_run(2, i, cap=1.9) for i in range(3)])
    # one held repeat is not enough to say
    assert not never_led(
        "slo-capacity",
        2,
        1,
        chosen + [_run(2, 0, cap=1.9)] + [_run(2, i, cap=None, held=False) for i in (1, 2)],
    )


def _summary(runs: list[RepeatRecord], limit: float = 0.01) -> Any:
    return summarize(
        runs_of("slo-capacity", runs),
        mode="slo-capacity",
        baseline_trial=0,
        repeats=3,
        runs_planned=len(runs),
        confidence=0.975,
        sd_floor=2.0,
        max_overlength_rate=limit,
    )


def test_the_look_stops_past_rivals_that_cannot_win_and_on_a_known_overlength() -> None:
    base = [_run(0, i, cap=c, role="baseline") for i, c in enumerate([1.56, 1.62, 1.59])]
    top = [_run(1, i, cap=c, rate=0.0058) for i, c in enumerate([1.90, 1.98, 2.02])]
    # a rival whose interval overlaps the recommended config's but that never led it
    twin = [_run(2, i, cap=c) for i, c in enumerate([1.90, 1.98, 2.02])]
    s = _summary(base + top + twin)
    assert s.verdict == "recommend" and s.chosen == 1
    assert s.candidate(2).interval.high >= s.candidate(1).interval.low
    assert settled_early(s, base + top + twin, 0.01, {1: 0.006})
    # the over-length bound of 3 samples (above 1 %) refuses; the known final rate does not
    assert not settled_early(s, base + top + twin, 0.01)
    assert not settled_early(s, base + top + twin, 0.01, {1: 0.0101})
    assert passed_over(s, base + top + twin) == (2,) and tied_with(s, base + top + twin) == ()
    # a rival that led on one sample but is tied with the recommended config (it beats the
    # baseline too, by a mean gain within the recommended config's interval): either would
    # be recommended, so it does not keep the phase running, and the look names it
    led = [_run(2, i, cap=c) for i, c in enumerate([1.90, 2.06, 1.98])]
    s2 = _summary(base + top + led)
    other = 3 - (s2.chosen or 0)
    assert other in (1, 2)
    assert settled_early(s2, base + top + led, 0.01, {1: 0.006, 2: 0.006})
    assert passed_over(s2, base + top + led) == ()
    assert tied_with(s2, base + top + led) == (other,)
    # a rival that led but whose runs do not show it beats the baseline keeps the phase
    # running: more runs could make it the best
    wide = [_run(2, i, cap=c) for i, c in enumerate([1.50, 2.40, 2.10])]
    s4 = _summary(base + top + wide)
    c2 = s4.candidate(2).interval
    assert s4.chosen == 1 and c2.low <= 0 < c2.mean
    assert not tied(s4.candidate(2), s4.candidate(1), None)
    assert not settled_early(s4, base + top + wide, 0.01, {1: 0.006, 2: 0.006})

    # nor does one whose mean gain lies above the recommended config's interval
    def cand(trial: int, mean: float, low: float, high: float) -> CandidateSummary:
        iv = Interval(mean, low, high, 3, 0.975, 2.0, 2.0)
        return CandidateSummary(trial, 3, 3, None, iv)

    chosen = cand(1, 20.0, 15.0, 25.0)
    assert tied(cand(2, 25.0, 1.0, 49.0), chosen, None)
    assert not tied(cand(2, 25.1, 1.0, 49.0), chosen, None)
    assert not tied(cand(2, 20.0, -1.0, 41.0), chosen, None)
    # beyond the noise band: a tie must gain more than the band, as a recommendation must
    rival, best = s2.candidate(other), s2.candidate(s2.chosen)
    assert tied(rival, best, 1.0)
    assert not tied(rival, best, rival.interval.mean + 0.1)
    # a rival that broke the SLOs in a run can never be recommended: no obstacle
    broke = [_run(2, 0, cap=None, held=False)] + [_run(2, i, cap=2.1) for i in (1, 2)]
    s3 = _summary(base + top + broke)
    assert s3.chosen == 1
    assert settled_early(s3, base + top + broke, 0.01, {1: 0.006})


def test_a_baseline_that_cannot_start_leaves_the_look_to_who_leads() -> None:
    # docs/tuning.md#7-validation, "No baseline to beat": the baseline cannot start (no
    # memory for the KV cache), so no gain decides and no pending run of it can pair with a
    # candidate; the look stops when the recommended config measured at least each rival's
    # figure on every shared sample
    def cannot(i: int) -> RepeatRecord:
        r = _run(0, i, cap=None, held=False, role="baseline")
        return replace(r, failure_class="NO_KV_MEMORY")

    out = [cannot(i) for i in range(3)]
    assert baseline_never_serves(0, out)
    top = [_run(1, i, cap=c) for i, c in enumerate([0.84, 0.86, 0.85])]
    below = [_run(2, i, cap=c) for i, c in enumerate([0.80, 0.86, 0.82])]
    s = _summary(out + top + below)
    assert s.verdict == "no-baseline" and s.chosen == 1
    assert settled_early(s, out + top + below, 0.01, {1: 0.0})
    assert passed_over(s, out + top + below) == (2,)
    # the recommended config's over-length must be settled too, as under "recommend"
    assert not settled_early(s, out + top + below, 0.01, {1: 0.0101})
    # a rival that led on one sample could still be the one recommended: the runs go on
    led = [_run(2, i, cap=c) for i, c in enumerate([0.80, 0.88, 0.82])]
    s2 = _summary(out + top + led)
    assert s2.verdict == "no-baseline" and s2.chosen == 1
    assert not settled_early(s2, out + top + led, 0.01, {1: 0.0, 2: 0.0})
    # a baseline that served but broke its SLOs in a run (or one that failed to start for
    # want of free memory, which another process may have held) can serve the pending runs,
    # pair with the candidates there and change their ranking: the runs go on
    served = [_run(0, 0, cap=0.7, held=False, role="baseline"), *out[1:]]
    s3 = _summary(served + top + below)
    assert s3.verdict == "no-baseline" and s3.chosen == 1
    assert not baseline_never_serves(0, served)
    assert not settled_early(s3, served + top + below, 0.01, {1: 0.0})
    busy = [replace(out[0], failure_class="FREE_MEMORY"), *out[1:]]
    assert not baseline_never_serves(0, busy)
    assert not settled_early(_summary(busy + top + below), busy + top + below, 0.01, {1: 0.0})


def test_progress_names_the_rivals_the_look_passed_over(capsys: pytest.CaptureFixture[str]) -> None:
    from autotune.cli.progress import progress_printer
    from autotune.tuning.run.events import ValidationSettledEarly

    show = progress_printer()
    show(ValidationSettledEarly(3, 5, 6, 15, (17,)))
    show(ValidationSettledEarly(3, 5, 6, 15, ()))
    show(ValidationSettledEarly(3, 5, 6, 16, (), (23,)))
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "validation: the verdict is settled after 3 of 5 repeats (the early look); 6 runs not "
        "needed",
        "  trial 17: never measured above trial 15 on a shared sample, so not run to the end",
        "validation: the verdict is settled after 3 of 5 repeats (the early look); 6 runs not "
        "needed",
        "validation: the verdict is settled after 3 of 5 repeats (the early look); 6 runs not "
        "needed",
        "  trial 23: beats the baseline too, by a mean gain within trial 16's interval; the runs "
        "cannot tell them apart, so not run to the end",
    ]
