"""The test tiers: which tests are ``smoke`` and which are ``slow`` (tests/conftest.py marks
them at collection; one list here, so a tier is read and changed in one place).

- ``smoke`` (``python -m pytest -m smoke``): at most 60 s on a two-core machine, and it
  touches every package of autotune; :data:`SMOKE` is keyed by package for that reason.
- ``slow``: a test that takes longer than a few seconds (measured with
  ``python -m pytest -m "not real_vllm" --durations=200``): ``-m "not slow"`` leaves them out.

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
    "gitrecord",
    "nightly",
    "planning",
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
    "gitrecord": ("tests/test_git_record.py::test_launch_script_and_trailers_round_trip",),
    "nightly": ("tests/test_nightly_drift.py",),
    "planning": ("tests/test_size_replicas.py",),
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
    # the twin strategy's studies with their CPU-bound rounds, and calibrating over HTTP
    "tests/test_twin_strategy.py::test_a_wrong_twin_is_refitted_and_finds_the_real_optimum",
    "tests/test_twin_strategy.py::test_real_trials_caps_the_twin_trials",
    "tests/test_twin_strategy.py::test_calibrate_from_study_fits_the_stored_levels",
    "tests/test_calibrate_cli.py",
    "tests/test_calibrate_fit.py::test_the_fit_recovers_known_constants_within_their_stated_uncertainty",
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
    # the rest of the suite: 8 s or more in a whole-suite run under pytest-xdist (-n 2) on the
    # same machine at load average 9 (about 4 s or more on an idle one)
    "tests/test_bad_input.py::test_bad_input_gives_one_line_and_keeps_the_database",
    "tests/test_claims.py::test_a_silent_remote_controllers_trial_is_failed_after_the_grace_period_and_retried",
    "tests/test_claims.py::test_the_sqlite_study_lock_excludes_another_process",
    "tests/test_compose.py::test_the_controller_entry_script_creates_then_resumes",
    "tests/test_compose_services.py::test_the_api_service_command",
    "tests/test_compose_services.py::test_the_scheduler_service_command",
    "tests/test_config_fields.py::test_every_config_field_has_a_marked_test",
    "tests/test_config_fields.py::test_extra_parameters_join_the_space",
    "tests/test_config_fields.py::test_random_and_grid_strategies",
    "tests/test_config_fields.py::test_stage_sizes",
    "tests/test_config_fields.py::test_storage_is_used_without_a_flag_or_variable",
    "tests/test_config_fields.py::test_timeout_s_is_a_runs_default_limit",
    "tests/test_early_stop.py::test_k_of_n_max_above_the_slo_put_the_final_p99_above_it",
    "tests/test_faults.py::test_an_enqueued_value_outside_the_space_is_refused_at_create",
    "tests/test_hostile_input.py::test_a_full_disk_is_one_line",
    "tests/test_hostile_input.py::test_yaml_limits_and_what_passes",
    "tests/test_nightly.py::test_dry_run_records_the_decision_but_writes_no_file",
    "tests/test_nightly.py::test_unchanged_workload_keeps_exit_0",
    "tests/test_nightly.py::test_within_noise_keeps",
    "tests/test_nightly_prometheus.py::test_refresh_from_a_real_prometheus",
    "tests/test_noise.py::test_a_sim_virtual_study_stores_the_noise_once",
    "tests/test_noise.py::test_a_study_on_a_server_whose_throughput_varies_20_percent_ends_too_noisy",
    "tests/test_parallel.py::test_four_devices_four_lanes_each_worker_sees_only_its_own",
    "tests/test_parallel.py::test_sigterm_stops_every_lane_and_requeues_each_trial_once",
    "tests/test_report.py::test_dashboard_api_shows_names_constraints_engine_values_and_notes",
    "tests/test_report.py::test_html_report_renders_offline_with_every_plot_drawn",
    "tests/test_report.py::test_the_fixture_has_feasible_and_infeasible_trials",
    "tests/test_scheduler.py::test_the_default_runner_runs_autotune_nightly_in_a_child",
    "tests/test_sim_serve.py::test_port_in_use_is_classified",
    "tests/test_sim_serve.py::test_serves_healthy_within_seconds_and_stops_on_sigterm",
    "tests/test_sim_serve.py::test_startup_delay_holds_back_health",
    "tests/test_sim_serve.py::test_startup_failures_exit_1_with_vllms_text",
    "tests/test_sim_serve.py::test_unknown_flag_is_an_argparse_error",
    "tests/test_sizing.py::test_small_workloads_are_not_sized_and_large_ones_scale_linearly",
    "tests/test_sizing.py::test_the_limit_refuses_and_the_flag_overrides",
    "tests/test_stages.py::test_candidates_that_break_the_overlength_limit_are_never_launched",
    "tests/test_stages.py::test_fixed_rate_study_recommends_the_widest_margin",
    "tests/test_stages.py::test_a_sim_study_with_a_fixed_kv_size_runs_no_memory_trial",
    "tests/test_stopped_levels.py::test_a_stopped_level_reports_a_rate_violation_only_when_the_requests_sent_make_it_certain",
    "tests/test_sustain.py::test_a_short_sample_at_a_high_load_is_judged_over_a_sustained_level",
    "tests/test_sustain.py::test_the_loop_reaches_both_minimums_with_the_fewest_whole_copies_at_the_same_rate",
    "tests/test_store_schema.py::test_shares_a_database_with_optuna",
    "tests/test_study.py::test_a_trial_a_killed_run_left_running_is_failed_and_retried_at_the_next_start",
    "tests/test_study.py::test_cli_end_to_end",
    "tests/test_study.py::test_cli_errors_are_one_line",
    "tests/test_study.py::test_joint_strategy_suggests_valid_configs",
    "tests/test_study.py::test_offline_mode_closed_loop_with_extra_parameter",
    "tests/test_study.py::test_run_resumes_and_interrupted_trials_fail_cleanly",
    "tests/test_study.py::test_sim_worker_study_runs_the_full_process_path",
    "tests/test_study.py::test_staged_study_baseline_first_then_one_parameter_per_stage",
    "tests/test_study.py::test_two_controllers_share_one_study_on_postgres",
    "tests/test_telemetry_prometheus.py::test_prometheus_mode_agrees_with_direct_scraping",
    "tests/test_telemetry_sim.py::test_token_budget_bound_through_http_server",
    "tests/test_text_lengths.py::test_first_trial_measures_and_asks_to_recreate",
    "tests/test_tokenizer.py::test_deterministic_across_processes",
    "tests/test_validate.py::test_a_study_validates_after_its_search_within_its_time_limit",
    "tests/test_validate.py::test_study_best_and_export_carry_the_interval",
    "tests/test_validate.py::test_validation_off_leaves_the_studys_answer_not_validated",
    "tests/test_worker_death.py::test_a_trial_keeps_the_partial_level_and_the_cause",
    "tests/test_worker_faults.py::test_a_study_retries_a_trial_whose_worker_was_killed_and_takes_the_retrys_verdict",
    "tests/test_workers_guard.py::test_the_death_signal_stops_the_worker_when_its_controller_is_killed",
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
