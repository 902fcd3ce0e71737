"""The test tiers: which tests are ``smoke`` and which are ``slow`` (tests/conftest.py marks
them at collection; one list here, so a tier is read and changed in one place).

- ``smoke`` (``python -m pytest -m smoke``): at most 60 s on a two-core machine, and it
  touches every package of autotune; :data:`SMOKE` is keyed by package for that reason.
- ``slow``: a test that takes longer than a few seconds (measured with
  ``python -m pytest -m "not real_vllm" --durations=0``): ``-m "not slow"`` leaves them out.
  The list is partial: it holds what one measured run reached (test files up to
  test_service.py), not yet the files after it.

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
        "tests/test_workload_profile.py::test_profile_percentiles_match_numpy_on_a_hand_example",
        "tests/test_workload_profile.py::test_peak_rate_matches_brute_force",
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
        "tests/test_interval.py::test_t_quantiles_match_the_table",
        "tests/test_interval.py::test_one_pair_gives_no_interval",
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
    ),
}

# Longer than a few seconds: each took 5 s or more in a run on a loaded two-core machine
# (``-v -o console_output_style=times``).
SLOW: tuple[str, ...] = (
    # real controllers and workers on a private PostgreSQL cluster: 13-52 s each
    "tests/test_faults.py::test_four_controllers_run_exactly_the_plan_each_configuration_once_in_stage_order",
    "tests/test_faults.py::test_controllers_or_workers_killed_mid_trial_leave_nothing_behind",
    "tests/test_faults.py::test_postgres_restarts_are_ridden_out_and_a_longer_outage_stops_the_run_cleanly",
    "tests/test_bench_sim.py::test_bench_reports_vllm_keys_and_goodput",
    "tests/test_capacity.py::test_every_trial_and_the_baseline_land_on_their_lattice_point",
    "tests/test_capacity.py::test_trial_numbers_are_optunas_after_a_resume",
    "tests/test_capacity.py::test_progress_show_and_export_name_each_violation",
    "tests/test_cli.py::test_subprocess_help_listing_and_error",
    "tests/test_cli.py::test_subprocess_sim_run",
    "tests/test_compose.py::test_docker_compose_config_validates",
    "tests/test_config_fields.py::test_enqueued_configs_run_first_and_the_seed_fixes_the_samples",
    "tests/test_config_fields.py::test_mode_decides_the_levels",
    "tests/test_config_fields.py::test_sim_worker_flags_reach_the_simulated_server",
    "tests/test_config_fields.py::test_warmup_requests_run_before_each_level_and_are_not_measured",
    "tests/test_config_fields.py::test_capacity_lattice_comes_from_the_strategy",
    "tests/test_early_stop.py::test_stopped_and_full_replays_of_a_timeline_reach_the_same_verdict",
    "tests/test_exit_codes.py::test_no_feasible_trial_exits_4",
    "tests/test_nightly.py::test_prompts_twice_as_long_promote_exit_3",
    "tests/test_parallel.py::test_two_controllers_with_lanes_share_one_study_exactly",
    "tests/test_post_run.py::test_a_baseline_that_measured_nothing_finishes_with_exit_0_and_its_report_renders",
    "tests/test_post_run.py::test_a_failing_dashboard_refresh_is_one_warning_and_the_run_exits_0",
    "tests/test_post_run.py::test_the_nightly_records_its_decision_even_when_rendering_fails",
    "tests/test_redact.py::test_a_server_with_an_api_key_is_smoke_tested_loaded_and_masked",
    "tests/test_service.py::test_a_posted_study_runs_in_a_child_process",
    "tests/test_worker_env.py::test_a_worker_receives_only_the_allow_listed_environment",
    "tests/test_workers.py::test_sim_worker_startup_failures",
    "tests/test_workers.py::test_sim_worker_end_to_end",
)


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
