"""The TrainingJob API: its schema, rules and status. The rest of Flywheel takes the job from here (`parse_job`,
`load_job`, `TrainingJob`, `TrainingJobSpec`, `SpecError`) and reads the sections it needs from their modules:

- job.py: the TrainingJob and its spec; parse.py: a job from YAML or a mapping, checked (the entry points below);
- base, sections, parallel, pod, pod_template, pod_merge: the spec's sections and what they become in a pod;
- status.py: the status the operator writes; timeouts.py: the collective timeouts faultTolerance implies;
- auto.py: the planner applied to a job (`parallelism.auto`); storage.py: checkpoint URLs and their rules;
- field_rules, k8s_syntax, object_names, pod_rules/: the Pod API's rules on what a job copies into its pods;
- crd/: the CustomResourceDefinition generated from the schema and the rules.

The model's shape and the layout rules, which the planner and the trainer share, live below in flywheel/layout/."""

from flywheel.spec.job import API_VERSION, KIND, SpecError, TrainingJob, TrainingJobSpec
from flywheel.spec.parse import load_job, parse_cluster_job, parse_job, parse_spec

__all__ = ["API_VERSION", "KIND", "SpecError", "TrainingJob", "TrainingJobSpec", "load_job", "parse_cluster_job",
           "parse_job", "parse_spec"]
