"""How steps run, knowing nothing of QNN: one heavy step per process (worker), external commands
(external), the state DB backend (statedb), the shared artifact cache (cache), per-stage slots (limits),
atomic files (files), the build/ layout (paths) and the CI matrix (matrix)."""
