"""The training convention gpuledger documents: a training job may expose two counters on its own `/metrics`,

    gpuledger_train_samples_total   samples (examples, sequences) processed since the process started
    gpuledger_train_steps_total     optimizer steps done since the process started

with any labels it likes (a job name, a rank, a model). Samples per GPU-hour is then the efficiency figure the
chargeback reports beside the cost. The labels are free, so every label is identity except the service (first of
`model_name`, `model`, `job_name`, `service`) and the pod/namespace ones; nothing is summed over.
"""
from __future__ import annotations

from gpuledger.collector.apps.spec import ServerReader, Source

SOURCES = (
    Source("gpuledger_train_samples_total", "train_samples", note="gpuledger convention"),
    Source("gpuledger_train_steps_total", "train_steps", note="gpuledger convention"),
)

READER = ServerReader(
    kind="training",
    sources=SOURCES,
    prefixes=("gpuledger_train_",),
    service_labels=("model_name", "model", "job_name", "service"),
    all_labels_identity=True,
)
