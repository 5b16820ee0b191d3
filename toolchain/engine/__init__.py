"""How a build runs, knowing nothing of QNN or a model, in three rooms: running a step (run/), what
doit remembers and how it decides "up to date" (state/), and the shared artifact cache (cache/);
beside them the build's settings as data (options), atomic files and hashes (files), the engine's
own build/ files (paths) and installed versions (versions)."""
