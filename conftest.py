"""Shared test configuration (at the root so that component tests beside their code get it too).

Fixtures that start real servers live in their own modules beside this file
(one per service) and are loaded as plugins here. A server fixture never skips
silently in CI: when ``CI`` is set and the server cannot be started, it fails.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "tests"))

pytest_plugins = ["kafka_fixtures", "clickhouse_fixtures"]

import os  # noqa: E402  (after the sys.path insert above: the fixtures live in tests/)

import pytest  # noqa: E402


def _shared_dir() -> Path:
    """``../shared`` beside the checkout (the project's real data and spec).

    EROICA_SHARED overrides it; a clone elsewhere (CI's clean checkout under
    /tmp) falls back to the workplace's /work/shared.
    """
    env = os.environ.get("EROICA_SHARED")
    if env:
        return Path(env)
    beside = Path(__file__).resolve().parents[1] / "shared"
    return beside if beside.is_dir() else Path("/work/shared")


SHARED = _shared_dir()


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The real data folder; absent only outside CI, where its tests skip with a reason."""
    if not (SHARED / "data").is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"real data folder {SHARED / 'data'} is missing in CI")
        pytest.skip(f"real data folder {SHARED / 'data'} not found (set EROICA_SHARED)")
    return SHARED


# --- Test tiers (issue 35 item 6) ----------------------------------------------------------------
# Every collected test gets exactly one of `unit`, `integration`, `chaos` here, and `slow` on top
# where it takes long; test modules carry no tier markers of their own. `make check` runs
# `-m "unit and not slow"`; `make test` (CI) runs everything. tests/test_tiers.py keeps this complete.

TIERS = ("unit", "integration", "chaos")

# Fixtures that start a server (a broker, clickhouse-server, a JVM cluster, a real exporter) or that
# only exist for tests starting their own: a test that uses one (directly or through another
# fixture) is an integration test. `clickhouse_config` is one only in its "server" variant: its
# "chdb" variant is the in-process engine.
SERVER_FIXTURES = frozenset({
    "kafka_bootstrap",          # tests/kafka_fixtures.py: tansu (or a container / EROICA_TEST_KAFKA)
    "kafka_broker",             # one Apache Kafka JVM
    "_kafka_cluster_module",    # three Apache Kafka JVMs (kafka_cluster uses it)
    "apache_kafka_installed",   # for tests that start their own Apache Kafka
    "clickhouse_server",        # tests/clickhouse_fixtures.py: a private clickhouse-server
    "clickhouse_shards",        # two of them
    "clickhouse_server_binary",  # for tests that start their own clickhouse-server
    "node_exporter",            # producers/counters/test_exporter.py: the real prometheus-node-exporter
})

# Tests that start a broker or a whole stack themselves, with no fixture to tell (node ids without
# their parameters; a module path stands for all its tests).
INTEGRATION_TESTS = frozenset({
    "stack/test_tansu.py",  # every test starts the tansu binary
    "stack/test_local.py::test_a_killed_tansu_broker_is_restarted_with_the_sink",  # a LocalStack: tansu + sink
    "producers/test_replay.py::test_replay_against_a_broker_killed_midway_reports_what_was_delivered",  # TansuBroker
    "tests/test_demo.py::test_demo_names_the_throttled_gpu_and_keeps_its_data",  # `eroica demo`: the whole stack
    "tests/test_stack_cli.py::test_up_status_query_restart_and_sigterm",  # `eroica up`
    "tests/test_prometheus.py::test_a_real_prometheus_scrapes_every_role_of_a_running_stack",  # `eroica up` + Prometheus
    # `eroica up` (tansu, or Apache Kafka through request.getfixturevalue, which item.fixturenames does not show)
    "tests/test_streaming_equals_batch.py::test_replay_through_the_stack_stores_the_verdict_ids_of_analyze",
    "tests/test_bench_live.py::test_live_replay_of_a_small_job_through_eroica_up_keeps_up_and_finds_the_fault",  # `eroica up`
    "tests/test_bench_live.py::test_live_edge_digests_of_a_small_job_through_eroica_up_keeps_up_and_finds_the_fault",
    "tests/test_edge_digests.py::test_edge_digests_through_the_stack",  # `eroica up`
})

# Unit tests that take long: more than 1 s (setup, call and teardown) in a `pytest -m unit` run on
# the 2-core development machine under a load average of about 10 (so about 0.3 s on an idle
# core), the threshold that keeps `make check` near 2 minutes there. A module whose shared fixture
# (module or session scope) took more than 1 s to set up is listed whole: leaving out its first
# test would only move that cost onto the next one. Integration and chaos tests are not listed:
# `make check` leaves them out anyway. A test not listed counts as fast; measure again with
# `pytest -m "unit and not slow" --durations=30` and add what has grown.
SLOW_TESTS: frozenset[str] = frozenset({
    "kafka/test_client.py::test_sasl_scram_over_tls_from_the_environment",  # 1 s
    "kafka/test_publisher.py::test_replay_policy_blocks_and_never_drops_failures_are_counted",  # 1 s
    "models/test_frames.py::test_property_frames_of_any_slice_round_trip",  # 3 s
    "models/test_limits_kernel.py::test_kernel_at_the_bound_and_on_the_fast_paths",  # 3 s
    "models/test_limits_kernel.py::test_kernel_walks_as_the_interpreted_walk",  # 29 s
    "producers/agent/test_agent.py::test_agent_cli_needs_one_destination",  # 2 s
    "producers/agent/test_agent.py::test_agent_cli_runs_cleanly_here",  # 4 s
    "producers/counters/test_exporter_sim.py::test_bridged_counters_give_the_verdict_ids_of_direct_counters",  # 28 s
    "producers/importers/test_kineto.py::test_control_import",  # 9 s
    "producers/importers/test_kineto.py::test_real_trace_optimizer_step_alone",  # 23 s
    "producers/importers/test_kineto.py::test_real_trace_pattern_alone_and_refusal",  # 2 s
    "producers/importers/test_kineto.py::test_real_trace_without_markers_gets_the_marked_steps",  # 18 s
    "producers/importers/test_kineto.py::test_sampled_ranks_import",  # 2 s
    "producers/importers/test_kineto.py::test_test_trace_imports",  # 8 s
    "producers/importers/test_kineto.py::test_whatif_on_a_trace_without_markers_reports_no_cost",  # 6 s
    "producers/importers/test_optable.py::test_straggler_trace_import",  # 4 s
    "producers/test_replay.py::test_digest_replay_paced_by_event_time_digests_no_batch_before_its_newest_record",  # 2 s
    "producers/test_replay.py::test_digest_replay_that_declares_closes_windows_sooner_and_loses_nothing",  # 6 s
    "producers/test_replay.py::test_replay_paced_by_event_time_sends_no_frame_before_its_newest_record",  # 1 s
    "producers/tracer/test_groups.py::test_distinct_sets_get_distinct_ids_within_the_contract_length",  # 13 s
    "producers/tracer/test_torch_hooks.py::test_collectives_and_ddp_gradient_all_reduces",  # 15 s
    "producers/tracer/test_torch_hooks.py::test_ddp_built_before_or_around_instrumentation",  # 29 s
    "producers/tracer/test_torch_hooks.py::test_explicit_instrumentation_only_what_is_given",  # 26 s
    "producers/tracer/test_torch_hooks.py::test_point_to_point_records_peer_bytes_and_only_waited_transfers",  # 25 s
    "producers/tracer/test_torch_hooks.py::test_sigterm_dumps_open_spans_in_flight",  # 21 s
    "producers/tracer/test_torch_hooks.py::test_training_loop_is_traced_with_steps",  # 30 s
    "producers/tracer/test_trace_alarms.py::test_a_short_traced_job_alarms_on_its_slowed_rank_only",  # 101 s
    "producers/tracer/test_trace_e2e.py::test_trace_then_analyze_names_the_slowed_rank",  # 30 s
    # not reached by the measured run; they run torchrun jobs as test_trace_e2e does (about 30 s each there)
    "producers/tracer/test_trace_fsdp.py",
    "producers/tracer/test_trace_overlap.py",
    "producers/tracer/test_trace_pipeline.py",
    "runtime/test_metrics.py::test_each_process_exports_only_its_own_families",  # 2 s
    "sinks/clickhouse/test_query_guard.py::test_a_heavy_read_never_blocks_inserts",  # 4 s
    "sinks/clickhouse/test_query_guard.py::test_read_limits_are_the_servers",  # 2 s
    "stack/test_local.py::test_a_crashing_child_is_restarted_then_given_up",  # 1 s
    "stack/test_local.py::test_restart_budget_is_per_window_with_exponential_backoff",  # 1 s
    "streams/cores/test_cores.py::test_a_held_grace_waits_for_digests_an_outage_held_up",  # 3 s
    "streams/cores/test_cores.py::test_a_restarted_detector_resumes_from_its_state",  # 14 s
    "streams/cores/test_cores.py::test_a_restarted_summariser_rereading_from_the_commit_point_changes_nothing",  # 9 s
    "streams/cores/test_cores.py::test_an_extreme_duration_gives_the_same_verdicts_in_batch_and_stream",  # 4 s
    "streams/cores/test_cores.py::test_corrupt_frames_are_dead_lettered_and_the_partition_goes_on",  # 1 s
    "streams/cores/test_cores.py::test_declared_watermarks_close_windows_earlier",  # 15 s
    "streams/cores/test_cores.py::test_declared_watermarks_give_the_verdicts_of_analyze",  # 35 s
    "streams/cores/test_cores.py::test_every_message_delivered_twice_gives_the_verdicts_of_analyze",  # 16 s
    "streams/cores/test_cores.py::test_grace_period_analyses_an_incomplete_window_and_late_digests_are_dropped",  # 2 s
    "streams/cores/test_cores.py::test_paced_replay_with_small_windows_loses_no_record",  # 33 s
    "streams/cores/test_cores.py::test_smaller_windows_match_analyze_with_the_same_window",  # 20 s
    "streams/cores/test_cores.py::test_stream_digests_carry_spans_across_window_ends_as_batch_does",  # 20 s
    "streams/cores/test_cores.py::test_streaming_cores_give_the_verdicts_of_analyze",  # 25 s
    "streams/cores/test_coverage.py::test_incremental_completeness_equals_from_scratch",  # 6 s
    "streams/cores/test_event_time.py::test_a_record_far_outside_its_jobs_time_changes_no_verdict",  # 3 s
    "streams/cores/test_job_end.py::test_a_job_replayed_in_two_calls_loses_nothing_silently",  # 50 s
    "streams/detection/test_budget.py::test_a_heavy_job_beside_a_normal_one_is_bounded_and_changes_none_of_its_verdicts",  # 22 s
    "streams/detection/test_budget.py::test_a_jobs_state_is_folded_to_fit_its_message",  # 16 s
    "streams/detection/test_budget.py::test_folding_keeps_each_ranks_time_and_the_costliest_functions",  # 1 s
    "streams/detection/test_budget.py::test_the_fold_does_not_depend_on_row_order",  # 1 s
    "streams/detection/test_budget.py::test_the_streaming_cores_fold_and_fit_the_message",  # 10 s
    "streams/detection/test_cost.py::test_simulated_window_cost_ignores_row_order",  # 1 s
    "streams/detection/test_cost_twins.py",  # 12 s (all 2 tests; 27 s in all)
    "streams/detection/test_grouping.py::test_leave_one_out_medians_are_np_quantile_bits",  # 13 s
    "streams/detection/test_grouping.py::test_leave_one_out_medians_of_all_ports_at_once_are_the_scalar_ones",  # 1 s
    "streams/detection/test_kernels.py",  # 5 s (a shared fixture's setup; 42 s in all)
    "tests/test_alert_job_end.py",  # 1 s (a shared fixture's setup; 2 s in all)
    "tests/test_analyze_e2e.py",  # 14 s (all 6 tests; 131 s in all)
    "tests/test_analyze_memory.py::test_an_analysed_window_is_freed_before_the_next_batch_is_read",  # 2 s
    "tests/test_apache_kafka.py::test_up_refuses_kafka_and_broker_together",  # 3 s
    "tests/test_bench_throughput.py::test_bench_throughput_passes_share_one_input",  # 19 s
    "tests/test_bench_throughput.py::test_bench_throughput_tiny",  # 25 s
    "tests/test_columns.py::test_valid_records_validate_and_round_trip",  # 4 s
    "tests/test_compose.py::test_every_variable_set_is_read_and_required_ones_are_set",  # 8 s
    "tests/test_compose.py::test_worker_variables_are_read_by_the_workers",  # 2 s
    "tests/test_dashboards.py::test_every_dashboard_query_runs",  # 2 s
    "tests/test_detection_engine.py::test_every_fault_is_localised_on_a_seed_the_benchmark_does_not_use",  # 13 s
    "tests/test_detection_engine.py::test_one_off_spikes_and_rank0_logging_stay_below_alarm",  # 8 s
    "tests/test_detection_engine.py::test_persisting_problem_keeps_one_incident_and_a_verdict_id_per_window",  # 6 s
    "tests/test_detection_engine.py::test_real_kineto_traces_import_and_analyse",  # 10 s
    "tests/test_detection_engine.py::test_real_straggler_trace_names_the_last_stage_as_workload",  # 3 s
    "tests/test_detection_engine.py::test_regression_is_found_against_the_jobs_own_history",  # 4 s
    "tests/test_determinism.py",  # 99 s (a shared fixture's setup; 315 s in all)
    "tests/test_docs.py::test_mkdocs_build_is_strict_and_clean",  # 7 s
    "tests/test_edge_digests.py",  # 28 s (a shared fixture's setup; 80 s in all)
    "tests/test_fastjson.py::test_bench_sized_run_is_scanned_and_equal",  # 4 s
    "tests/test_fastjson.py::test_files_of_fuzzed_lines_give_todays_batches",  # 10 s
    "tests/test_fastjson.py::test_float_literals_decode_bit_for_bit",  # 26 s
    "tests/test_fastjson.py::test_line_soundness_on_fuzzed_lines",  # 19 s
    "tests/test_fastjson.py::test_real_traces_equal",  # 7 s
    "tests/test_fastjson.py::test_simulated_runs_are_scanned_and_equal",  # 9 s
    "tests/test_fastjson.py::test_strings_that_differ_in_one_byte_of_a_word",  # 1 s
    "tests/test_first_hour.py::test_errors_are_one_line_and_debug_shows_the_traceback",  # 9 s
    "tests/test_first_hour.py::test_no_stack_is_one_actionable_line",  # 2 s
    "tests/test_first_hour.py::test_verdict_tables_cut_no_word_at_80_columns",  # 7 s
    "tests/test_first_hour.py::test_whatif_table_fits_80_columns_with_long_kernel_names",  # 2 s
    "tests/test_fleet.py::test_fleet_command",  # 2 s
    "tests/test_frontend_ports_e2e.py",  # 9 s (all 2 tests; 17 s in all)
    "tests/test_fuzz_atheris.py::test_atheris_finds_nothing_in_a_bounded_run",  # 120 s
    "tests/test_import_graph.py::test_every_eroica_import_resolves",  # 14 s
    "tests/test_import_graph.py::test_imports_go_down_the_layers",  # 15 s
    "tests/test_import_graph.py::test_no_cycle_between_subpackages",  # 13 s
    "tests/test_import_graph.py::test_no_cycle_between_top_level_packages",  # 28 s
    "tests/test_independent.py::test_collective_members_leave_together",  # 3 s
    "tests/test_independent.py::test_every_record_passes_the_reader",  # 4 s
    "tests/test_independent.py::test_same_seed_same_bytes_other_seed_differs",  # 4 s
    "tests/test_independent.py::test_truth_is_well_formed",  # 4 s
    "tests/test_independent_layouts.py",  # 39 s (all 2 tests; 168 s in all)
    "tests/test_job_isolation.py",  # 53 s (a shared fixture's setup; 129 s in all)
    "tests/test_lost_records.py",  # 7 s (a shared fixture's setup; 42 s in all)
    "tests/test_names_are_data.py",  # 5 s (a shared fixture's setup; 10 s in all)
    "tests/test_packaging.py",  # 13 s (a shared fixture's setup; 13 s in all)
    "tests/test_poison_inputs.py::test_analyze_reports_the_nested_line_and_analyses_the_rest",  # 4 s
    "tests/test_poison_inputs.py::test_replay_dead_letters_the_nested_line_whole_and_sends_the_rest",  # 2 s
    "tests/test_prometheus.py::test_promtool_checks_and_tests_the_shipped_rules",  # 3 s
    "tests/test_reader.py::test_any_bytes_are_accounted_for",  # 6 s
    "tests/test_reader.py::test_any_file_never_crashes_the_reader",  # 3 s
    "tests/test_reader.py::test_any_truncation_of_gzip_never_crashes",  # 4 s
    "tests/test_reader.py::test_block_fast_path_equals_line_by_line",  # 3 s
    "tests/test_reader.py::test_buffered_blocks_hold_the_input_lines",  # 4 s
    "tests/test_reader.py::test_owned_blocks_parse_as_the_reader_does",  # 6 s
    "tests/test_reader.py::test_stdin_dash_subprocess",  # 3 s
    "tests/test_realistic.py::test_bench_cli_json",  # 9 s
    "tests/test_realistic.py::test_checkpoint_leaves_gpus_idle",  # 10 s
    "tests/test_realistic.py::test_collector_styles_drop_the_job_record_stacks_and_write_collectives_as_nccl_kernels",  # 3 s
    "tests/test_realistic.py::test_default_profile_is_byte_identical",  # 1 s
    "tests/test_realistic.py::test_deterministic",  # 3 s
    "tests/test_realistic.py::test_extra_ports",  # 4 s
    "tests/test_realistic.py::test_fsdp_moves_dp_traffic_into_the_blocks",  # 4 s
    "tests/test_realistic.py::test_healthy_run_has_no_straggler",  # 4 s
    "tests/test_realistic.py::test_missing_fields",  # 3 s
    "tests/test_realistic.py::test_moe_jitter_is_per_step_not_per_rank",  # 3 s
    "tests/test_realistic.py::test_pipeline_schedules_run",  # 12 s
    "tests/test_realistic.py::test_realised_step_time_follows_the_plan",  # 4 s
    "tests/test_realistic.py::test_realistic_records_validate_and_count",  # 11 s
    "tests/test_realistic.py::test_truth_is_the_same_with_nuisances",  # 4 s
    "tests/test_records.py::test_mutated_records_are_classified",  # 34 s
    "tests/test_repeated_records.py",  # 14 s (a shared fixture's setup; 74 s in all)
    "tests/test_report.py",  # 42 s (a shared fixture's setup; 100 s in all)
    "tests/test_simulator.py::test_every_record_validates",  # 1 s
    "tests/test_simulator.py::test_nic_signature",  # 1 s
    "tests/test_simulator.py::test_pipeline_receiver_waits_for_sender",  # 1 s
    "tests/test_small_jobs.py",  # 5 s (all 2 tests; 14 s in all)
    "tests/test_status_frozen_broker.py::test_broker_health_follows_the_probe",  # 1 s
    "tests/test_status_frozen_broker.py::test_status_under_a_frozen_tansu",  # 18 s
    "tests/test_status_views.py::test_two_alert_consumers_are_both_listed_and_dead_ones_dropped",  # 3 s
    "tests/test_step_windows.py::test_a_rank_that_stops_reporting_holds_nothing_back",  # 8 s
    "tests/test_step_windows.py::test_five_minute_steps_give_the_published_cause_at_default_settings",  # 7 s
    "tests/test_step_windows.py::test_node_clock_offsets_change_no_finding",  # 4 s
    "tests/test_step_windows.py::test_steps_longer_than_the_window_give_the_published_cause",  # 6 s
    "tests/test_tiers.py::test_every_collected_test_has_exactly_one_tier",  # 55 s
    "tests/test_tree_table.py::test_every_listed_folder_and_module_has_a_summary",  # 1 s
    "tests/test_tree_table.py::test_folder_table_matches_the_tree",  # 2 s
    "tests/test_typecheck.py::test_a_made_up_attribute_on_a_project_type_fails_the_type_check",  # 44 s
    "tests/test_typecheck.py::test_a_real_attribute_passes",  # 6 s
    "tests/test_whatif.py::test_hardware_culprits_are_priced_as_hardware",  # 6 s
    "tests/test_whatif.py::test_real_straggler_trace_matches_published_result",  # 5 s
    "tests/test_whatif.py::test_simulator",  # 8 s
    "tests/test_whatif_reference.py::test_s_agrees_with_the_reference",  # 58 s
})


def _base_id(nodeid: str) -> str:
    """``path::name`` without the parameters, with the path relative to the root."""
    return nodeid.split("[", 1)[0]


def _listed(nodeid: str, listed: frozenset[str]) -> bool:
    base = _base_id(nodeid)
    path = base.split("::", 1)[0]
    return base in listed or path in listed


def tier_of(nodeid: str, fixturenames: "list[str] | tuple[str, ...]", params: "dict[str, object]") -> str:
    """The one tier of a test, from its node id, the fixtures it uses and its parameters."""
    if _base_id(nodeid).startswith("tests/chaos/"):
        return "chaos"
    used = set(fixturenames) & SERVER_FIXTURES
    if used or (params.get("clickhouse_config") == "server" and "clickhouse_config" in fixturenames):
        return "integration"
    if _listed(nodeid, INTEGRATION_TESTS):
        return "integration"
    return "unit"


def pytest_collection_modifyitems(config: pytest.Config, items: "list[pytest.Item]") -> None:
    for item in items:
        callspec = getattr(item, "callspec", None)
        params = dict(callspec.params) if callspec is not None else {}
        tier = tier_of(item.nodeid, list(getattr(item, "fixturenames", ())), params)
        item.add_marker(getattr(pytest.mark, tier))
        if _listed(item.nodeid, SLOW_TESTS):
            item.add_marker(pytest.mark.slow)
