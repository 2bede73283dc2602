"""The names of the Kubernetes objects the operator makes from a TrainingJob's name, defined once, and the limits on
the job's name and replica counts that keep every one of them valid. Pure; no imports, so the schema (spec/job.py)
derives its limits from the same functions the operator names its objects with (worker_plan.py, operator/manifests.py,
operator/spare_pods.py).

The tightest name the job's name goes into is a worker's or spare's pod name, which is also the pod's hostname:
a DNS-1123 label of at most 63 characters. The job's Service (`<job>-workers`, also the pods' subdomain) must be a
DNS-1035 label, which starts with a letter, so the job's name must too. The job's name is also the value of the
`flywheel.dev/job` label and names its PodGroup and PodDisruptionBudget, all of which a DNS-1035 label of at most
MAX_NAME_LENGTH characters satisfies.
"""

from __future__ import annotations

DNS_LABEL_MAX = 63
# Workers and spares are numbered from 0; bounding their counts bounds the digits their pod names end with.
MAX_REPLICAS = 100_000


def worker_name(job_name: str, index: int) -> str:
    return f"{job_name}-worker-{index}"


def spare_name(job_name: str, number: int) -> str:
    return f"{job_name}-spare-{number}"


def service_name(job_name: str) -> str:
    return f"{job_name}-workers"


def _longest_suffix() -> int:
    last = MAX_REPLICAS - 1
    return max(len(worker_name("", last)), len(spare_name("", last)), len(service_name("")))


# The longest job name whose every derived name (pod, hostname, Service, subdomain) still fits in a DNS label.
MAX_NAME_LENGTH = DNS_LABEL_MAX - _longest_suffix()
