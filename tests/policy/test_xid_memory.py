"""Fatal-XID actions remembered on the node: already handled after an operator restart (policy/xid_memory.py)."""

from __future__ import annotations

from flywheel.policy.health_checks import HealthSettings, HealthState, Observations, WatchedJob, evaluate
from flywheel.policy.xid import NodeFault, WatchedPod, XidClass, XidEvent, XidSample
from flywheel.policy.xid_memory import after_fault, already_handled, format_handled, nodes_to_check, parse_handled

POD = WatchedPod("train-worker-0", "ml", "train", "0", "node-a", "Running", 0.0)
FATAL = XidEvent(XidSample("node-a", "GPU-0", 79), XidClass.FATAL)


def test_the_annotation_round_trips_and_skips_what_does_not_parse() -> None:
    assert parse_handled(format_handled({"GPU-1": 48, "GPU-0": 79})) == {"GPU-0": 79, "GPU-1": 48}
    assert format_handled({"GPU-1": 48, "GPU-0": 79}) == "GPU-0=79,GPU-1=48"
    assert parse_handled("GPU-0=79, junk,=3,GPU-2=x") == {"GPU-0": 79}
    assert parse_handled(None) == {}


def test_a_fault_acted_on_is_merged_into_the_node_memory() -> None:
    fault = NodeFault("node-a", (79,), (POD,), True, (("GPU-0", 79),))
    assert after_fault({"GPU-0": 48, "GPU-1": 48}, fault) == {"GPU-0": 79, "GPU-1": 48}


def test_after_a_restart_the_same_code_on_the_same_gpu_is_already_handled() -> None:
    assert already_handled(FATAL, None, {"node-a": {"GPU-0": 79}})
    assert already_handled(FATAL, None, {"node-a.example.com": {"GPU-0": 79}})  # the exporter's FQDN matches


def test_another_code_or_gpu_or_no_memory_is_new() -> None:
    assert not already_handled(FATAL, None, {"node-a": {"GPU-0": 48}})
    assert not already_handled(FATAL, None, {"node-a": {"GPU-1": 79}})
    assert not already_handled(FATAL, None, {})


def test_a_change_the_running_monitor_saw_is_new_whatever_the_annotation() -> None:
    assert not already_handled(FATAL, {("node-a", "GPU-0"): 0}, {"node-a": {"GPU-0": 79}})
    # A series back after an exporter restart: this process has no memory of it, the node has.
    assert already_handled(FATAL, {("node-b", "GPU-0"): 0}, {"node-a": {"GPU-0": 79}})


def test_only_fatal_codes_unknown_to_the_process_need_the_node_memory() -> None:
    samples = [XidSample("node-a.example.com", "GPU-0", 79), XidSample("node-b", "GPU-0", 13),
               XidSample("node-c", "GPU-0", 48)]
    assert nodes_to_check(None, samples, [POD]) == ["node-a", "node-c"]  # by the pod's node name
    assert nodes_to_check({("node-c", "GPU-0"): 48, ("node-a.example.com", "GPU-0"): 79}, samples, [POD]) == []


def test_evaluate_does_not_act_again_on_a_handled_fatal_xid() -> None:
    job = WatchedJob("ml", "train", "Running", 60.0, 600.0, (POD,))
    obs = Observations(now=100.0, jobs=[job], progress=None, step_times=None, xids=[FATAL.sample])
    acted, state = evaluate(obs, HealthState(), HealthSettings())
    assert [f.gpus for f in acted.node_faults] == [(("GPU-0", 79),)]
    remembered = Observations(now=100.0, jobs=[job], progress=None, step_times=None, xids=[FATAL.sample],
                              xid_handled={"node-a": {"GPU-0": 79}})
    again, state = evaluate(remembered, HealthState(), HealthSettings())
    assert again.node_faults == () and state.xid_codes == {("node-a", "GPU-0"): 79}
    changed = Observations(now=101.0, jobs=[job], progress=None, step_times=None,
                           xids=[XidSample("node-a", "GPU-0", 48)], xid_handled={"node-a": {"GPU-0": 79}})
    assert [f.codes for f in evaluate(changed, state, HealthSettings())[0].node_faults] == [(48,)]


def test_a_fault_whose_actions_failed_is_raised_again_at_the_next_evaluation() -> None:
    job = WatchedJob("ml", "train", "Running", 60.0, 600.0, (POD,))
    # The exporter names the FQDN; the fault, the pod's node name.
    samples = [XidSample("node-a.example.com", "GPU-0", 79), XidSample("node-a.example.com", "GPU-1", 0),
               XidSample("node-b", "GPU-0", 13)]
    obs = Observations(now=100.0, jobs=[job], progress=None, step_times=None, xids=samples)
    acted, state = evaluate(obs, HealthState(), HealthSettings())
    [fault] = acted.node_faults
    assert evaluate(obs, state, HealthSettings())[0].node_faults == ()  # acted on: not again
    retry = state.forget_fault(fault)
    assert retry.xid_codes == {("node-a.example.com", "GPU-1"): 0, ("node-b", "GPU-0"): 13}  # only its GPUs
    assert evaluate(obs, retry, HealthSettings())[0].node_faults == (fault,)
    assert HealthState().forget_fault(fault) == HealthState()  # no XID answer yet: nothing to forget
