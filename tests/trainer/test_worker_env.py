import hashlib
import json

import pytest
import torch
import torch.distributed as dist

from flywheel.agent.worker_env import UserError, WorkerEnv
from flywheel.contracts.faults import Fault
from flywheel.trainer.models.gpt.model import GPT, GPTConfig
from flywheel.trainer.step import params_sha256

from .workers import free_port, job_spec

BASE = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "FLYWHEEL_SPEC": json.dumps(job_spec(2)),
        "FLYWHEEL_CHECKPOINT_DIR": "/ckpt/job"}


def test_worker_env_is_read_from_the_contract_variables():
    env = WorkerEnv.from_environ(dict(BASE, FLYWHEEL_JOB="team-a/gpt", FLYWHEEL_REPLICA_INDEX="3",
                                      TORCHELASTIC_RESTART_COUNT="2", FLYWHEEL_METRICS_PORT="9400",
                                      FLYWHEEL_FAULTS='[{"id": "f0", "kind": "kill", "rank": 1, "step": 4}]',
                                      FLYWHEEL_STEP_DELAY_SECONDS="0.05"))
    assert (env.rank, env.local_rank, env.world_size, env.restart_count) == (1, 1, 2, 2)
    assert (env.namespace, env.job, env.replica, env.metrics_port) == ("team-a", "gpt", "3", 9400)
    assert env.spec.trainer.training.steps == 8 and env.checkpoint_dir == "/ckpt/job"
    assert env.faults == [Fault(id="f0", kind="kill", step=4, rank=1)] and env.step_delay_s == 0.05
    assert env.fault_dir == "/ckpt/job/.faults" and env.events_file is None  # defaults
    assert WorkerEnv.from_environ(BASE).step_delay_s == 0.0


@pytest.mark.parametrize(("change", "message"), [
    ({"RANK": None}, "RANK is not set"),
    ({"WORLD_SIZE": "two"}, "not an integer"),
    ({"FLYWHEEL_SPEC": None}, "FLYWHEEL_SPEC is not set"),
    ({"FLYWHEEL_SPEC": "{"}, "FLYWHEEL_SPEC"),
    ({"FLYWHEEL_SPEC": json.dumps({"trainer": {"training": {"steps": 0}}})}, "steps"),
    ({"FLYWHEEL_FAULTS": '[{"kind": "kill"}]'}, "lacks"),
    ({"FLYWHEEL_STEP_DELAY_SECONDS": "slow"}, "FLYWHEEL_STEP_DELAY_SECONDS='slow' is not a number of seconds"),
    ({"FLYWHEEL_STEP_DELAY_SECONDS": "-1"}, "from 0 to 60"),
    ({"FLYWHEEL_STEP_DELAY_SECONDS": "nan"}, "from 0 to 60"),
])
def test_bad_worker_env_is_a_user_error(change, message):
    environ = {k: v for k, v in dict(BASE, **change).items() if v is not None}
    with pytest.raises(UserError, match=message):
        WorkerEnv.from_environ(environ)


def test_params_hash_is_over_the_sorted_full_state_dict_in_fp32():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        model = GPT(GPTConfig(layers=1, dim=16, heads=2, vocab=32, seq_len=8), seed=5)
        expected = hashlib.sha256()
        for key, tensor in sorted(model.state_dict().items()):
            expected.update(tensor.float().contiguous().numpy().tobytes())
        assert params_sha256(model) == expected.hexdigest()
        with torch.no_grad():
            model.ln_f.bias.add_(1e-6)
        assert params_sha256(model) != expected.hexdigest()
    finally:
        dist.destroy_process_group()
