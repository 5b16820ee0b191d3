"""Running a step: one heavy step per process (worker, its fork server zygote), external commands
(external), per-stage slots (limits), one build per folder (buildlock), and what a build shows and
records of its time (progress, trace)."""
