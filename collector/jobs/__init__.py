"""Job lifecycle sources: what the scheduler says about each job (submitted, eligible, started, requeued, finished
and how), as opposed to the GPU telemetry of collector/*_source.py. Each scheduler's format is one parser of its
own (sacct.py, ...) behind the small interface in lifecycle.py."""

# the job record formats `gpuledger import` reads, one parser module each (sacct.py, squeue.py, kube_state.py)
JOB_FORMATS = ("sacct", "squeue", "kube-state")
# the scheduler queue state it reads (kueue.py, kai.py: their /metrics pages; sacctmgr.py: Slurm's association
# limits): quotas and limits in force, usage, waiting workloads
QUEUE_FORMATS = ("kueue", "kai", "sacctmgr")
# where `serve --jobs-from` reads job lifecycle and queues continuously (prometheus_jobs.py; slurm_commands.py:
# squeue, sacct and sacctmgr run on the server's host)
JOB_SOURCES = ("none", "prometheus", "slurm")
