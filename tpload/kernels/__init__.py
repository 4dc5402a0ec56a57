"""The compiled CPU kernels and what is computed with them: the kernels themselves
(:mod:`.compiled`, numba; :mod:`.gguf`, GGUF's block decodes), their lazy face (:mod:`.lazy`:
imported on first use, warmed beside a load's first steps) and the fingerprint of a window
(:mod:`.fingerprint`). This face imports nothing: planning needs none of it."""
