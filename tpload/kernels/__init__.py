"""The compiled CPU kernels and what is computed with them: the kernels themselves
(:mod:`.compiled`, numba; :mod:`.gguf`, GGUF's block decodes), their Python side shared by both
implementations (:mod:`.calls`), the same kernels compiled ahead into an extension module
(:mod:`.build` compiles it, :mod:`.ahead` checks and loads it without numba), their lazy face
(:mod:`.lazy`: loaded on first use, warmed beside a load's first steps) and the fingerprint of a
window (:mod:`.fingerprint`). This face imports nothing: planning needs none of it."""
