"""The test tiers: which tests are ``smoke`` and which are ``slow`` (tests/conftest.py marks
them at collection; one list here, so a tier is read and changed in one place).

- ``smoke`` (``python -m pytest -m smoke``): at most 60 s on a two-core machine, and it
  touches every package of autotune; :data:`SMOKE` is keyed by package for that reason.
- ``slow``: a test that takes longer than a few seconds (measured with
  ``python -m pytest -m "not real_vllm" --durations=0``): ``-m "not slow"`` leaves them out.

An entry is a test file, a test (``file::name``, every parametrization) or one
parametrization; tests/test_tiers.py checks that every entry names a test that exists.
"""

from __future__ import annotations

__all__ = ["PACKAGES", "SLOW", "SMOKE", "tier_marks"]

# autotune's packages (autotune/<name>/ and autotune/<name>.py) the smoke tier must touch
PACKAGES = (
    "config",
    "workload",
    "loadgen",
    "telemetry",
    "sim",
    "workers",
    "store",
    "tuning",
    "report",
    "nightly",
    "service",
    "cli",
)

SMOKE: dict[str, tuple[str, ...]] = {
    "config": (
        "tests/test_exit_codes.py::test_config_error_exits_1",
        "tests/test_config_fields.py::test_config_fields_walk_every_section",
    ),
    "workload": (
        "tests/test_workload_profile.py",
        "tests/test_workload_arrivals.py",
    ),
    "loadgen": ("tests/test_loadgen_metrics.py",),
    "telemetry": ("tests/test_telemetry.py",),
    "sim": ("tests/test_engine.py",),
    "workers": (
        "tests/test_workers.py::test_vllm_argv_spelling_order_and_round_trip",
        "tests/test_workers.py::test_vllm_argv_rejects_duplicate_and_reserved_flags",
        "tests/test_worker_env.py::test_the_allow_list",
    ),
    "store": ("tests/test_store.py",),
    "tuning": (
        "tests/test_trial_branches.py",
        "tests/test_capacity.py::test_lattice_points_and_index",
        "tests/test_capacity.py::test_monotone_feasibility_gives_one_lattice_point_whatever_the_start",
        "tests/test_interval.py",
        "tests/test_edges.py",
    ),
    "report": ("tests/test_report_parts.py",),
    "nightly": ("tests/test_nightly_drift.py",),
    "service": (
        "tests/test_service.py::test_openapi_document_matches_the_routes",
        "tests/test_service.py::test_auth",
        "tests/test_service.py::test_bad_inputs_get_4xx_json_and_change_nothing",
    ),
    "cli": (
        "tests/test_cli.py::test_help",
        "tests/test_cli.py::test_sim_run_json",
        "tests/test_cli.py::test_main_usage_error_exits_2",
        "tests/test_exit_codes.py::test_missing_study_exits_4",
    ),
}

SLOW: tuple[str, ...] = ()


def _matches(nodeid: str, entry: str) -> bool:
    return nodeid == entry or nodeid.startswith((entry + "::", entry + "["))


def tier_marks(nodeid: str) -> list[str]:
    """The tier markers (``smoke``, ``slow``) of the test with this node id."""
    marks = []
    if any(_matches(nodeid, e) for entries in SMOKE.values() for e in entries):
        marks.append("smoke")
    if any(_matches(nodeid, e) for e in SLOW):
        marks.append("slow")
    return marks
